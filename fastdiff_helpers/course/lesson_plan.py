"""What a lesson waits for and downloads, per card: the course clock's estimated GPU wait on an
H100, the plan's on a T4, and the weights a lesson adds to those of the lessons before it. The
lesson labels' arithmetic (lessons.py) reads them.

Introduced in README.md ("The syllabus").
"""

from __future__ import annotations

from ..models.gpus import PROFILES
from .planning import clock
from .planning.clock_record import RECORDED
from ..models.downloads import download_bytes, files_dtype
from .planning.course_downloads import course_downloads, for_card
from .planning.plan import plan
from .planning.plan import card_work

__all__ = ["waits", "t4_waits", "cell_waits", "wait_words", "downloads_line"]


def waits(core: list[str] | None = None) -> dict[str, float]:
    """Estimated GPU wait in seconds per notebook on an H100 (the course clock), the `core`
    notebooks as the core path runs them alone, the others as the whole course runs top to
    bottom."""
    whole = clock.estimate()["notebooks"]
    out = {name: n["total_s"] for name, n in whole.items()}
    if core:
        path = clock.estimate(notebooks=[n for n in core if n in whole])["notebooks"]
        out.update({name: n["total_s"] for name, n in path.items()})
    return out


def t4_waits(core: list[str] | None = None) -> dict[str, float]:
    """Estimated GPU wait in seconds per notebook on a T4, as `plan --gpu t4` says it (what
    runs there, swapped or skipped; the `core` notebooks as the core path runs them alone)."""
    out = {row["notebook"]: row["minutes"] * 60 for row in plan(PROFILES["t4"], list(RECORDED))}
    path = [n for n in core or [] if n in out]
    if path:
        out.update({row["notebook"]: row["minutes"] * 60 for row in plan(PROFILES["t4"], path)})
    return out


def cell_waits(core: list[str]) -> dict[str, dict[str, tuple[float, float]]]:
    """Estimated GPU wait in seconds of each cell of the `core` notebooks, run alone and in
    order: (on an H100, the course clock; on a T4, the clock with the plan's work for that card,
    as `plan --gpu t4` adds them up). {notebook: {cell id: (h100, t4)}}."""
    t4 = PROFILES["t4"]
    h100 = clock.estimate(notebooks=core)["notebooks"]
    on_t4 = clock.estimate(sms=t4.sms, gpu=t4, works={n: card_work(t4, n) for n in core}
                           )["notebooks"]
    return {name: {cell: (c["total_s"], on_t4[name]["cells"][cell]["total_s"])
                   for cell, c in h100[name]["cells"].items()} for name in h100}


def wait_words(h100_s: float, t4_s: float) -> str:
    """How a lesson's text says a cell's estimated wait: "est. 2 min on an H100, 7 min on a T4"
    (whole minutes; "under a minute" below one)."""
    def said(seconds: float) -> str:
        return "under a minute" if seconds < 60 else f"{round(seconds / 60)} min"
    return f"est. {said(h100_s)} on an H100, {said(t4_s)} on a T4"


_NAMES = {"sdxl": "SDXL", "sd15": "SD1.5", "ssd1b": "SSD-1B", "pixart": "PixArt-alpha",
          "flux": "FLUX.1-dev", "flux-schnell": "FLUX.1-schnell", "fp16-fix": "the fp16-fix VAE"}


def _files(rows) -> str:
    return ", ".join(f"{_NAMES.get(model, model)} {files} weights ({nbytes / 1e9:.1f} GB)"
                     for model, files, nbytes, _ in rows)


def _on_t4(rows):
    """The rows a T4 downloads in place of `rows`: a model whose fp32 does not fit it loads in
    the card's half precision (settings.baseline), so its half-precision files."""
    kept, _ = for_card(rows, PROFILES["t4"])
    out = {(m, f): (m, f, b, n) for m, f, b, n in kept}
    for model, files, _, notebooks in rows:
        if not any(row[:2] == (model, files) for row in kept):
            half = files_dtype(model, "bf16")
            out.setdefault((model, half), (model, half, download_bytes(model, half), notebooks))
    return list(out.values())


def downloads_line(name: str, path: list[str]) -> str:
    """What lesson `name` downloads the first time it runs: the weights it needs that the
    lessons before it on the day did not (a core lesson, in `path`: the core lessons before it;
    an optional one: the whole core path), on an H100, and on a T4 where that differs (a model
    whose fp32 does not fit a T4 loads in half precision there). The first lesson of `path`,
    the set-up notebook, says the whole core path's, on an H100 and on a T4."""
    before = path[:path.index(name)] if name in path else path
    rows, had_rows = course_downloads([name]), course_downloads(before) if before else []
    had = {(m, f) for m, f, _, _ in had_rows}
    new = [row for row in rows if (row[0], row[1]) not in had]
    line = (f"Downloads: {_files(new)}, the first time." if new else
            "Downloads: nothing new (the weights of the lessons before it).")
    had_t4 = {(m, f) for m, f, _, _ in _on_t4(had_rows)}
    new_t4 = [row for row in _on_t4(rows) if (row[0], row[1]) not in had_t4]
    if [r[:2] for r in new_t4] != [r[:2] for r in new]:
        line = line[:-1] + f"; on a T4, {_files(new_t4) if new_t4 else 'nothing new'}."
    if name == path[0]:
        day = course_downloads(path)
        t4, _ = for_card(day, PROFILES["t4"])
        line += (f" The whole core path downloads {sum(r[2] for r in day) / 1e9:.1f} GB on an "
                 f"H100: {_files(day)}. On a T4, where fp32 SDXL does not fit, "
                 f"{sum(r[2] for r in t4) / 1e9:.1f} GB.")
    return line
