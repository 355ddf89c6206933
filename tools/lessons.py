"""The course as a workshop day: each notebook's track (core or optional) and its minutes, the
text a participant sees, and the one-day core path.

Introduced in README.md ("The syllabus"). `.venv/bin/python -m tools.lessons` prints the table;
`--write` puts each notebook's label and downloads line (its first cell) and the README's
syllabus columns in line with it. A lesson's minutes, on an H100 and on a T4, are its reading
time (visible words at READING_WPM), the estimated GPU wait on that card (the course clock,
course/planning/clock.py, on an H100; the plan, course/planning/plan.py, on a T4; the core notebooks
as the core path runs them, alone and in order) and its exercises' minutes on that card, rounded up
to 5. The downloads line names the weights a lesson adds to those of the lessons before it
(course/planning/course_downloads.py); the set-up notebook's says what the whole day downloads.
The waits and the downloads per card are the second part of this module.

What a participant sees ("visible text"): the markdown cells, less folded `<details>` blocks,
fenced code and HTML comments. Provenance, caveats and the project's tooling go in the folded
blocks (each titled for what it holds) or in docs/.

It reads and writes the course's source (notebooks/, README.md), so it lives in tools/, in the
clone, not in the installed package.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fastdiff_helpers.course.planning.course_downloads import download_bytes, files_dtype
from fastdiff_helpers.course.planning.gpus import PROFILES
from fastdiff_helpers.course.planning import clock
from fastdiff_helpers.course.planning.clock_record import RECORDED
from fastdiff_helpers.course.planning.course_downloads import course_downloads, for_card
from fastdiff_helpers.course.planning.plan import card_work, plan
from tools.opening import badges, cell_text, colab_gpu, first_cell, with_first_cell

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"

# The one-day path, as a demanding instructor would choose it: the blog's techniques in order,
# what the first compiled call costs (a workshop waits for it), and the course's own biggest
# lever (fewer denoiser calls). The rest is optional: depth on one idea (profiling, CUDA
# graphs, autotuning), hardware the room may lack (fp8, several GPUs), or long runs (all
# models, Flux).
CORE = tuple(f"{n:02d}" for n in range(11))  # 00 to 10: the files in the day's order
READING_WPM = 200     # words a minute of technical prose, read with the code beside it
ROUND_TO = 5          # a label's minutes are rounded up to this
CORE_WORDS, OPTIONAL_WORDS = 1_200, 1_800   # visible words, at most, per lesson
PATH_WORDS, COURSE_WORDS = 12_000, 20_000   # on the core path, and in all
CELL_WAIT_S = 180     # no core cell waits longer on an H100 (the course clock)


LABEL = re.compile(r"^\*\*(Core|Optional) · (\d+) min on an H100, (\d+) on a T4\*\*")
DOWNLOADS = re.compile(r"^Downloads: .*$")
EXERCISE = re.compile(r"^\*\*(\d+)\. (.+?)\*\* · (\d+) min on an H100, (\d+) on a T4 · "
                      r"(CPU|GPU|CPU or GPU)\s*$", re.M)
ANSWER = re.compile(r"<details>\s*<summary>\s*Answer\b", re.I)
DETAILS = re.compile(r"<details>.*?</details>", re.S | re.I)
SUMMARY = re.compile(r"<details>\s*<summary>(.*?)</summary>", re.S | re.I)
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+(?=[\"'(\[*_`]*[A-Z0-9`])")


def notebooks() -> list[Path]:
    """The course's notebooks, in the course's order."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def track(name: str) -> str:
    """"core" or "optional" for a notebook's file name (or its two-digit number)."""
    return "core" if name[:2] in CORE else "optional"


def core_path() -> list[str]:
    """The core notebooks' file names, in the order the day runs them."""
    return [p.name for p in notebooks() if p.name[:2] in CORE]


def _markdown(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "markdown"]


def visible(markdown: str) -> str:
    """What a reader sees of a markdown text before unfolding anything: without folded
    `<details>` blocks, fenced code and HTML comments."""
    return FENCE.sub(" ", DETAILS.sub(" ", COMMENT.sub(" ", markdown)))


def visible_text(path: Path) -> str:
    return "\n\n".join(visible(cell) for cell in _markdown(path))


def words(text: str) -> int:
    return len(text.split())


def sentences(text: str) -> list[str]:
    """The sentences of a visible text: paragraphs and list items split at sentence ends;
    headings, tables, labels and bare lines of markup left out."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text):
        lines = [line.strip() for line in block.splitlines()]
        lines = [line for line in lines if line and not line.startswith(("#", "|", "<"))
                 and not LABEL.match(line) and not EXERCISE.match(line)]
        flat = re.sub(r"^(?:[-*]|\d+\.)\s+", "", " ".join(lines))
        found += [s for s in SENTENCE_END.split(flat) if len(s.split()) >= 1]
    return found


def sentence_lengths(text: str) -> list[int]:
    return [len(s.split()) for s in sentences(text)]


@dataclass(frozen=True)
class Exercise:
    number: int
    title: str
    minutes: int     # on an H100
    t4_minutes: int  # on a T4
    where: str       # "CPU", "GPU" or "CPU or GPU"
    answered: bool   # a folded answer follows it


def exercises(path: Path) -> list[Exercise]:
    """The exercises under "## Exercises": each a line "**N. Title** · M min on an H100, T on a
    T4 · CPU|GPU|CPU or GPU", its question, then its answer folded in a
    `<details><summary>Answer...` block."""
    text = "\n\n".join(_markdown(path))
    start = text.find("\n## Exercises")
    if start < 0:
        return []
    end = text.find("\n## ", start + 5)
    section = text[start:end if end > 0 else len(text)]
    heads = list(EXERCISE.finditer(section))
    found = []
    for i, head in enumerate(heads):
        body = section[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(section)]
        found.append(Exercise(int(head.group(1)), head.group(2), int(head.group(3)),
                              int(head.group(4)), head.group(5), bool(ANSWER.search(body))))
    return found


def label(path: Path) -> tuple[str, int, int] | None:
    """(track, minutes on an H100, minutes on a T4) as the notebook's first cell says it, or
    None."""
    cells = _markdown(path)
    lines = [line for line in (cells[0].splitlines() if cells else [])[1:] if line.strip()]
    found = LABEL.match(lines[0]) if lines else None
    return (found.group(1).lower(), int(found.group(2)), int(found.group(3))) if found else None


def downloads_said(path: Path) -> str | None:
    """The downloads line of the notebook's first cell (the line after its label), or None."""
    cells = _markdown(path)
    lines = [line for line in (cells[0].splitlines() if cells else [])[1:] if line.strip()]
    return lines[1] if len(lines) > 1 and DOWNLOADS.match(lines[1]) else None


def _rounded(raw: float) -> int:
    return max(ROUND_TO, ROUND_TO * math.ceil(raw / ROUND_TO - 1e-9))


@dataclass(frozen=True)
class Lesson:
    name: str
    track: str
    words: int
    reading_min: float
    wait_min: float        # on an H100
    exercise_min: int      # on an H100
    t4_wait_min: float = 0.0
    t4_exercise_min: int = 0

    @property
    def minutes(self) -> int:
        """On an H100."""
        return _rounded(self.reading_min + self.wait_min + self.exercise_min)

    @property
    def t4_minutes(self) -> int:
        return _rounded(self.reading_min + self.t4_wait_min + self.t4_exercise_min)

    @property
    def label(self) -> str:
        return (f"**{self.track.capitalize()} · {self.minutes} min on an H100, "
                f"{self.t4_minutes} on a T4**")


def lessons(paths: Iterable[Path] | None = None) -> list[Lesson]:
    path = core_path()
    seconds, t4 = waits(path), t4_waits(path)
    out = []
    for path in paths or notebooks():
        n = words(visible_text(path))
        found = exercises(path)
        out.append(Lesson(path.name, track(path.name), n, n / READING_WPM,
                          seconds.get(path.name, 0.0) / 60, sum(e.minutes for e in found),
                          t4.get(path.name, 0.0) / 60, sum(e.t4_minutes for e in found)))
    return out


def path_minutes(found: list[Lesson] | None = None, t4: bool = False) -> int:
    """The core path's minutes on an H100 (or a T4): the sum of its lessons' labels."""
    return sum(lesson.t4_minutes if t4 else lesson.minutes for lesson in found or lessons()
               if lesson.track == "core")


def table(found: list[Lesson] | None = None) -> str:
    found = found or lessons()
    lines = ["| notebook | track | visible words | reading (min) | est. GPU wait, H100 / T4 "
             "(min) | exercises, H100 / T4 (min) | label, H100 / T4 (min) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for lesson in found:
        lines.append(f"| {lesson.name} | {lesson.track} | {lesson.words:,} | "
                     f"{lesson.reading_min:.0f} | {lesson.wait_min:.1f} / "
                     f"{lesson.t4_wait_min:.1f} | {lesson.exercise_min} / "
                     f"{lesson.t4_exercise_min} | {lesson.minutes} / {lesson.t4_minutes} |")
    core = [lesson for lesson in found if lesson.track == "core"]
    lines.append(f"| **core path** ({len(core)}) | | {sum(x.words for x in core):,} | | "
                 f"{sum(x.wait_min for x in core):.0f} / {sum(x.t4_wait_min for x in core):.0f}"
                 f" | {sum(x.exercise_min for x in core)} / "
                 f"{sum(x.t4_exercise_min for x in core)} | **{path_minutes(found)} / "
                 f"{path_minutes(found, t4=True)}** |")
    return "\n".join(lines)


def _write_notebook(path: Path, nb: dict) -> None:
    # as JupyterLab writes a notebook (tools/nbclean.py)
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def write_labels(found: list[Lesson] | None = None) -> list[str]:
    """Put each notebook's label line (the first line after its title), its first cell
    (opening.first_cell) and Colab's GPU, and the README's syllabus columns and badges, in line
    with `lessons()`. Returns the files changed."""
    changed = []
    cell = first_cell()
    for lesson in found or lessons():
        path = NOTEBOOKS / lesson.name
        before = path.read_text(encoding="utf-8")
        nb = with_first_cell(json.loads(before), cell, colab_gpu(lesson.name))
        first = nb["cells"][0]
        lines = cell_text(first).split("\n")
        at = next((i for i, line in enumerate(lines[1:], 1) if line.strip()), None)
        if at is not None and (LABEL.match(lines[at]) or OLD_LABEL.match(lines[at])):
            lines[at] = lesson.label
        else:
            lines[1:1] = ["", lesson.label]
            at = 2
        said = downloads_line(lesson.name, core_path())
        after = next((i for i, line in enumerate(lines[at + 1:], at + 1) if line.strip()), None)
        if after is not None and DOWNLOADS.match(lines[after]):
            lines[after] = said
        else:
            lines[at + 1:at + 1] = ["", said]  # a paragraph of its own
        first["source"] = "\n".join(lines).splitlines(keepends=True)
        _write_notebook(path, nb)
        if path.read_text(encoding="utf-8") != before:
            changed.append(str(path.relative_to(ROOT)))
    readme = README.read_text(encoding="utf-8")
    updated = syllabus_columns(readme, found or lessons())
    if updated != readme:
        README.write_text(updated, encoding="utf-8")
        changed.append("README.md")
    return changed


SYLLABUS_HEAD = "| # | notebook | track | min, H100 / T4 | what you learn | open in |"
SYLLABUS_TOP = re.compile(r"^\| # \| notebook \| track \| min(?:, H100 / T4)? \| what you learn \|"
                          r"( open in \|)?\n\|(?:---\|){5,6}$", re.M)
SYLLABUS_ROW = re.compile(r"^\| (\d\d) \| (\[\d\d_\w+\.ipynb\]\(notebooks/(\d\d_\w+\.ipynb)\)) \| "
                          r"(Core|Optional) \| (\d+(?: / \d+)?) \| (.+?) \|"
                          r"(?: \[!\[Open in Colab.*\|)?$", re.M)
PATH_LINE = re.compile(r"(The core path: )(\d+) notebooks, (about \d+ h \d+ min)( on an H100 and "
                       r"about \d+ h \d+ min on a T4)?")
OLD_LABEL = re.compile(r"^\*\*(Core|Optional) · (\d+) min\*\*")  # before the T4's minutes


def _hours(minutes: int) -> str:
    return f"about {minutes // 60} h {minutes % 60:02d} min"


def syllabus_columns(readme: str, found: list[Lesson], repository: str | None = None) -> str:
    """The README with its syllabus rows' track, minutes and Open-in badges, and the core
    path's line, as `found` says."""
    by_number = {lesson.name[:2]: lesson for lesson in found}

    def row(match: re.Match) -> str:
        lesson = by_number.get(match.group(1))
        if lesson is None:
            return match.group(0)
        return (f"| {match.group(1)} | {match.group(2)} | {lesson.track.capitalize()} | "
                f"{lesson.minutes} / {lesson.t4_minutes} | {match.group(6)} | "
                f"{badges(match.group(3), repository)} |")

    core = [x for x in found if x.track == "core"]
    out = SYLLABUS_TOP.sub(SYLLABUS_HEAD + "\n" + "|---" * 6 + "|", readme)
    out = SYLLABUS_ROW.sub(row, out)
    return PATH_LINE.sub(lambda m: f"{m.group(1)}{len(core)} notebooks, "
                                   f"{_hours(path_minutes(found))} on an H100 and "
                                   f"{_hours(path_minutes(found, t4=True))} on a T4", out)


# -- what a lesson waits for and downloads, per card ---------------------------------------
# The course clock's estimated GPU wait on an H100, the plan's on a T4, and the weights a
# lesson adds to those of the lessons before it: what the labels' arithmetic above reads.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m tools.lessons", description=(
        "The course as a workshop day: each notebook's track, words and minutes, and the core "
        "path (README's syllabus)."))
    parser.add_argument("--write", action="store_true",
                        help="put each notebook's label and the README's columns in line")
    args = parser.parse_args(argv)
    found = lessons()
    print(table(found))
    for path in write_labels(found) if args.write else []:
        print(f"fastdiff: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
