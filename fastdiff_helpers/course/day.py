"""The day's result: each rung of the course's ladder a participant measured in a core lesson,
kept as it ran (fdh.course.keep_rung), and one chart of them at the end of the last core lesson
(fdh.course.day_chart): fp32 to the last rung, each with its speed-up and PSNR against the fp32
image, its cold start, and the blog's ratio for the same rung beside it. The chart reads what
the lessons kept; it runs nothing. A rung nobody kept is drawn as not run, with why where the
day's folder says (another model, another size).

Introduced in 01_baseline.ipynb (keep_rung) and 10_playground.ipynb (day_chart).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PIL import Image

from ..errors import FastdiffError
from ..measure.quality import compare_images
from .planning.published import BLOG_A100_SECONDS
from ..results.charts import ChartFigure
from ..results.store import Result, load_results
from .reference import save_result
from ..measure.record import seconds_text
from ..measure.record import psnr_text
from .planning.ladders import COURSE_LADDER
from ..techniques.recipe import Recipe

__all__ = ["keep_rung", "day_rungs", "day_table", "day_chart", "day_folder", "DAY_ENV",
           "BLOG_RUNG"]

DAY_ENV = "FASTDIFF_DAY_DIR"
RUNGS = [name for name, _ in COURSE_LADDER]
# the core lesson that keeps each rung of the core path (its GPU cells, where marked)
KEPT_IN = {"fp32, TF32 off": "01", "+ TF32": "02", "bf16": "02", "+ SDPA": "03",
           "+ compile": "04", "+ fused QKV": "06", "+ no sync": "07", "+ int8 dynamic": "08",
           "+ fp8 dynamic": "15", "+ autotune": "13"}
ON_A_GPU = {"+ fused QKV", "+ no sync", "+ int8 dynamic", "+ fp8 dynamic", "+ autotune"}
# the rungs of the optional lessons (15_fp8_hopper, 13_autotuning), past the core path's last
OPTIONAL_RUNGS = ("+ fp8 dynamic", "+ autotune")
# the blog's rung for each course rung it has one for (the blog's fp32 ran with TF32 on)
BLOG_RUNG = {"fp32, TF32 off": "fp32", "bf16": "bf16", "+ SDPA": "+ SDPA",
             "+ compile": "+ compile", "+ fused QKV": "+ fused QKV",
             "+ int8 dynamic": "+ int8 dynamic"}


def day_folder(folder: str | os.PathLike | None = None) -> Path:
    """Where the day's rungs are kept: `folder`, else $FASTDIFF_DAY_DIR, else out/day beside
    the notebooks (a notebook runs in its own folder)."""
    return Path(folder or os.environ.get(DAY_ENV) or Path("out") / "day")


def keep_rung(result: Result, folder: str | os.PathLike | None = None) -> Path | None:
    """Keep `result` for the day's chart, when its step is a rung of the course's ladder
    (fdh.course.COURSE_LADDER): its record and image go to the day's folder (day_folder). Says what
    it kept, and where the recipe that ran differs from the ladder's rung of that name (a
    CPU compiles without CUDA graphs); a result of another name is not kept, said in one line.
    Returns the results file, or None. Introduced in 01_baseline.ipynb."""
    if not isinstance(result, Result):
        raise FastdiffError(f"keep_rung takes a fdh.Result (what fdh.benchmark returns), not "
                            f"{type(result).__name__}.")
    if result.step not in RUNGS:
        print(f"fastdiff: not kept for the day's chart: {result.step!r} is not a rung of the "
              f"course's ladder ({', '.join(RUNGS)})")
        return None
    if result.error is not None or not result.latency_s:
        print(f"fastdiff: not kept for the day's chart: {result.step!r} has no timing")
        return None
    store = save_result(result, day_folder(folder))
    differ = _differs(result)
    print(f"fastdiff: kept for the day's chart: {result.step}, {seconds_text(result.latency_s)} "
          f"s ({store.parent})" + (f"; it ran with {differ}" if differ else ""))
    return store


def _differs(result: Result) -> str:
    """What the recipe that ran changes from the ladder's rung of its name ('' for nothing)."""
    wanted = dict(COURSE_LADDER)[result.step]
    try:
        ran = Recipe.from_dict(result.recipe)
    except (TypeError, FastdiffError):  # a record without a whole recipe: nothing to compare
        return ""
    return ", ".join(f"{name}={getattr(ran, name)!r}" for name in ran.changes(wanted))


def _same_run(result: Result, like: Result) -> bool:
    return ((result.model, result.weights, result.height, result.width, result.steps,
             result.device_name) == (like.model, like.weights, like.height, like.width,
                                     like.steps, like.device_name))


def day_rungs(model: str, weights: str, height: int, width: int, steps: int,
              device_name: str | None = None, folder: str | os.PathLike | None = None
              ) -> tuple[dict[str, Result], list[Result]]:
    """({rung: the last Result kept for it} for this model, weights, size and steps (and
    device, when given), every Result kept in the folder)."""
    store = day_folder(folder) / "results.jsonl"
    kept = load_results(store) if store.exists() else []
    found: dict[str, Result] = {}
    for r in kept:
        if (r.model, r.weights, r.height, r.width, r.steps) == (model, weights, height, width,
                                                                 steps) \
                and (device_name is None or r.device_name == device_name):
            found[r.step] = r  # the last kept wins: a lesson run again replaces its rung
    return found, kept


def _image(result: Result, folder: Path) -> Image.Image | None:
    if result.image is not None:
        return result.image
    if result.image_path and (folder / result.image_path).is_file():
        return Image.open(folder / result.image_path).convert("RGB")
    return None


def _why_missing(name: str, model: str, kept: list[Result], like: Result | None) -> str:
    others = sorted({r.model for r in kept if r.step == name and r.model != model})
    if others:
        return f"not run on {model} (kept for {', '.join(others)})"
    if like is not None and any(r.step == name and not _same_run(r, like) for r in kept):
        return "not run at this size, steps or weights"
    return f"not run (lesson {KEPT_IN[name]} keeps it{', on a GPU' if name in ON_A_GPU else ''})"


def day_table(settings: Any, folder: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One row per rung of the course's ladder (the optional lessons' only where kept), in order,
    for the model, weights, size and
    steps of `settings` (fdh.course.settings): seconds, speed-up and PSNR against the first
    kept rung (fp32, TF32 off where it ran), cold start, the blog's ratio for the same rung
    (fdh.course.BLOG_A100_SECONDS: its fp32 with TF32 on, on an A100), and what differs from the
    ladder's rung; a rung not kept has its reason instead. Reads the day's folder only."""
    base_folder = day_folder(folder)
    found, kept = day_rungs(settings.model, settings.weights, settings.height, settings.width,
                            settings.steps, folder=folder)
    first = next((found[n] for n in RUNGS if n in found), None)
    first_image = _image(first, base_folder) if first is not None else None
    blog = BLOG_A100_SECONDS.get(settings.model, {})
    rows = []
    for name in RUNGS:
        r = found.get(name)
        if r is None and name in OPTIONAL_RUNGS:
            continue  # the optional lessons' rungs: drawn only where one was run
        blog_ratio = (blog["fp32"] / blog[BLOG_RUNG[name]]
                      if name in BLOG_RUNG and BLOG_RUNG[name] in blog and "fp32" in blog else None)
        row: dict[str, Any] = {"rung": name, "blog_ratio": blog_ratio}
        if r is None:
            row["missing"] = _why_missing(name, settings.model, kept, first)
        else:
            image = _image(r, base_folder)
            quality = (compare_images(image, first_image) if image is not None
                       and first_image is not None else None)
            row.update(seconds=r.latency_s, speedup=first.latency_s / r.latency_s,
                       quality=quality, cold_start=r.cold_start_s, differs=_differs(r),
                       device=r.device_name)
        rows.append(row)
    return rows


def day_chart(settings: Any, folder: str | os.PathLike | None = None) -> ChartFigure:
    """The day's result in one chart: a bar per rung of the course's ladder that a core lesson
    kept (day_table), labelled with its seconds, speed-up, PSNR against the first rung and
    cold start, and the blog's A100 ratio for the same rung; a rung not kept says why. Prints
    the same as a table. Runs nothing. Introduced in 10_playground.ipynb."""
    rows = day_table(settings, folder)
    ran = [row for row in rows if "missing" not in row]
    first = ran[0]["rung"] if ran else None
    head = (f"{settings.model}, {settings.weights} weights, {settings.height}x{settings.width}, "
            f"{settings.steps} steps" + (f", {ran[0]['device']}" if ran else ""))
    print(f"The day's rungs ({head}): speed-up and PSNR against {first or 'the first rung'}; "
          "the blog's ratio against its own fp32 (TF32 on, A100-80GB).")
    table = [("rung", "seconds", "speed-up", "PSNR", "cold start", "blog", "")]
    for row in rows:
        blog = f"{row['blog_ratio']:.2f}x" if row["blog_ratio"] else "-"
        if "missing" in row:
            table.append((row["rung"], "-", "-", "-", "-", blog, row["missing"]))
            continue
        table.append((row["rung"], f"{seconds_text(row['seconds'])} s", f"{row['speedup']:.2f}x",
                      psnr_text(row["quality"]),
                      f"{seconds_text(row['cold_start'])} s" if row["cold_start"] is not None
                      else "-", blog, f"ran with {row['differs']}" if row["differs"] else ""))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    if settings.weights in ("tiny", "random"):
        print("  (tiny or random weights: a PSNR shows only that a rung runs, never image "
              "quality)")
    figure = ChartFigure(figsize=(10, 0.55 * len(rows) + 1.6))
    ax = figure.add_subplot()
    names = [row["rung"] for row in rows][::-1]
    seconds = [row.get("seconds", 0.0) for row in rows][::-1]
    ax.barh(names, seconds, color=["#bbbbbb" if "missing" in row else "#1f77b4"
                                   for row in rows][::-1])
    top = max(seconds) if any(seconds) else 1.0
    for y, row in enumerate(rows[::-1]):
        blog = f" | blog {row['blog_ratio']:.2f}x" if row["blog_ratio"] else ""
        if "missing" in row:
            text = row["missing"] + blog
        else:
            text = (f"{seconds_text(row['seconds'])} s, {row['speedup']:.2f}x, "
                    f"PSNR {psnr_text(row['quality'])}, cold "
                    f"{seconds_text(row['cold_start'])} s{blog}")
        ax.text(row.get("seconds", 0.0) + top * 0.01, y, text, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.9)
    ax.set_xlabel("seconds per image (median of the timed runs)")
    ax.set_title(f"The day's ladder: {head}", fontsize=10)
    figure.tight_layout()
    return figure
