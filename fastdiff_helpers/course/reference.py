"""The reference numbers a notebook quotes: the blog's published row, and every ladder this
project has measured on a GPU and committed under results/ (results/<gpu>/<model>/, the model's
first ladder, the blog's for the blog's models; results/<gpu>/<model>-<ladder>/, another, as
the project's reference run, `python3 -m tools.reference --ladder course`, writes it). Each
table says its GPU, weights, size and steps, and each rung's TF32 switches and VAE, so a figure
is never quoted without what it ran with.

Introduced in 01_baseline.ipynb. A run's own results folder is written here too (save_result,
save_figure: run_ladder's out=, the command line's --out, the day's rungs), in the layout the
committed ones have (RESULTS_FOLDER).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from .. import checks
from ..errors import FastdiffError
from ..models.presets import get_spec
from .planning.published import BLOG_A100_WHERE, FLUX_H100_WHERE, published_ladder
from ..results.store import Result, load_results, save_results
from ..results.tables import format_table
from .planning.ladders import LADDERS
from .planning.writes import output_folder

__all__ = ["reference_numbers", "reference_result", "reference_results", "reference_rate",
           "committed_ladders", "tf32_text", "LADDER_TITLES", "RESULTS_FOLDER", "save_result",
           "save_figure"]

LADDER_TITLES = {"blog": "the blog's ladder", "course": "the course's ladder",
                 "flux": "the course's Flux ladder"}


# The repository's results/ folder, read the same from a clone and from an installed package:
# in a clone it is a link to results/, in a wheel the package data (pyproject.toml).
REFERENCE_ROOT = Path(__file__).resolve().parent.parent / "reference_data"


def _root(root: str | os.PathLike | None) -> Path:
    """`root`, a folder laid out as results/ is, or the committed one."""
    return (REFERENCE_ROOT if root is None else checks.existing(
        "root", root, "the results folder (results/ of a checkout)", folder=True))


def reference_results(model: str, root: str | os.PathLike | None = None) -> dict[str, list[Result]]:
    """The project's committed GPU reference results for `model`: {gpu folder: [Result]}
    from results/<gpu>/<model>/results.jsonl ({} when none are committed yet).

    root defaults to REFERENCE_ROOT, the repository's results/ as the package ships it. What
    fdh.course.reference_numbers prints (01_baseline.ipynb). Introduced in 11_fitting_your_gpu.ipynb
    (the committed peak memory)."""
    base = _root(root)
    found: dict[str, list[Result]] = {}
    for path in sorted(base.glob(f"*/{model}/results.jsonl")):
        found[path.parent.parent.name] = load_results(path)
    return found


def _ladder_of(model: str, folder: Path) -> str | None:
    """The ladder a committed folder holds: what its reference.json says it ran, else its name
    (<model>: the model's first ladder; <model>-<ladder>: that one); None for another model's
    folder whose name starts alike."""
    suffix = folder.name[len(model):]
    if suffix and not suffix.startswith("-"):
        return None
    run = folder / "reference.json"
    if run.is_file():
        said = json.loads(run.read_text(encoding="utf-8")).get("run", {}).get("ladder")
        if said:
            return said
    return suffix[1:] if suffix else get_spec(model).ladders[0]


def committed_ladders(model: str, root: str | os.PathLike | None = None
                      ) -> list[tuple[str, str, Path, list[Result]]]:
    """(gpu folder, ladder, folder, its Results) for each ladder of `model` committed under
    `root` (default: results/ as the package ships it), in folder order."""
    base = _root(root)
    found = []
    for path in sorted(base.glob(f"*/{model}*/results.jsonl")):
        ladder = _ladder_of(model, path.parent)
        if ladder is not None:
            found.append((path.parent.parent.name, ladder, path.parent, load_results(path)))
    return found


def tf32_text(result: Result) -> str:
    """What TF32 did in a run, from its recorded switches: "TF32 off", "TF32 on" (matmuls and
    convolutions), or on for one of them; "TF32 not recorded" for a record without them."""
    state = result.tf32 if isinstance(result.tf32, dict) else {}
    if not state:
        return "TF32 not recorded"
    matmul, conv = state.get("matmul") == "tf32", state.get("cudnn_conv") == "tf32"
    if matmul and conv:
        return "TF32 on"
    if matmul or conv:
        return f"TF32 on in {'matmuls' if matmul else 'convolutions'} only"
    return "TF32 off"


def _vae_text(result: Result) -> str:
    return "the pipeline's own VAE" if result.vae in (None, "pipeline") else f"VAE {result.vae}"


def _conditions(results: Sequence[Result]) -> list[str]:
    """What a committed table was measured under, and what its PSNR column can say."""
    runs = sorted({(r.device_name, r.weights, r.height, r.width, r.steps) for r in results})
    lines = [f"{device}, {weights} weights, {h}x{w}, {steps} steps"
             for device, weights, h, w, steps in runs]
    if any(r.weights in ("random", "tiny") for r in results):
        lines.append("(random or tiny weights: the PSNR column shows how far each step moves "
                     "the numbers, never image quality)")
    rungs = [f"{r.step}: {tf32_text(r)}, {_vae_text(r)}" for r in results]
    lines.append("each rung's TF32 and VAE: " + "; ".join(rungs))
    return lines


def reference_numbers(model: str, steps: str | Sequence[str] | None = None,
                      root: str | os.PathLike | None = None, ladder: str | None = None) -> None:
    """Print the reference numbers for `model`: the published row of its first ladder (the
    blog's A100-80GB row, fdh.course.BLOG_A100_SECONDS, with fdh.course.BLOG_A100_WHERE saying where it was
    read; for FLUX.1-dev diffusers-torchao's H100 figures, fdh.course.FLUX_H100_SECONDS), then every
    ladder this project committed for it (committed_ladders: one table per GPU and ladder, with
    its conditions and each rung's TF32 and VAE), or a line saying that none is committed yet.

    ladder= keeps one ladder ("course": the course's own, with no published row; "blog": the
    blog's); steps= keeps only those rungs ("bf16", "+ SDPA", "fp32, TF32 off", ...); a name
    that no table shown holds is refused. root= is the results folder (default: the committed
    results/, shipped in the package).

    Compare times only between runs on the same GPU, weights, resolution and steps.
    Introduced in 01_baseline.ipynb."""
    spec = get_spec(model)
    key = spec.key
    if ladder is not None and ladder not in spec.ladders:
        raise FastdiffError(f"ladder={ladder!r}: {key} has the ladders {list(spec.ladders)}.")
    first = spec.ladders[0]
    published = published_ladder(key, first) if ladder in (None, first) else None
    tables = [t for t in committed_ladders(key, root) if ladder is None or t[1] == ladder]
    wanted = [steps] if isinstance(steps, str) else list(steps) if steps is not None else None
    if wanted is not None:
        known = set(published[2]) if published else set()
        for name in (ladder,) if ladder else spec.ladders:
            known |= set(dict(LADDERS[name]))
        for *_, results in tables:
            known |= {r.step for r in results}
        unknown = [step for step in wanted if step not in known]
        if unknown:
            raise FastdiffError(f"Unknown step(s) {unknown} for reference_numbers: use the "
                                f"rung names {sorted(known)}, or steps=None for all.")
    if published is not None:
        row = {s: v for s, v in published[2].items() if wanted is None or s in wanted}
        if row:
            print(f"Published ({published[1]}), {key}:")
            print("  " + ", ".join(f"{step}: {seconds} s" for step, seconds in row.items()))
            print(f"  read from: {BLOG_A100_WHERE.get(key) or FLUX_H100_WHERE}")
    elif ladder in (None, first):
        print(f"No published ladder for {key} (the figures the course cites are FLUX.1-dev's).")
    if not tables:
        where = f"{key}-{ladder}" if ladder not in (None, first) else key
        title = f" of {LADDER_TITLES.get(ladder, ladder)}" if ladder else ""
        print(f"No GPU reference results{title} for {key} are committed yet "
              f"(results/<gpu>/{where}/results.jsonl).")
    for gpu_name, name, folder, results in tables:
        shown = [r for r in results if wanted is None or r.step in wanted]
        print(f"\nMeasured by this project on {gpu_name}, {LADDER_TITLES.get(name, name)} "
              f"(results/{gpu_name}/{folder.name}):")
        for line in _conditions(shown or results):
            print("  " + line)
        print(format_table(shown) if shown else
              f"  none of the steps {wanted} (measured: {[r.step for r in results]})")


def reference_result(model: str, rung: str, ladder: str = "course", gpu: str | None = None,
                     root: str | os.PathLike | None = None) -> Result:
    """The committed Result of one rung of `ladder` (the course's by default) for `model`: the
    first GPU folder that holds it, or `gpu`'s (a folder name under results/). A notebook
    quotes a GPU figure through it, so the figure is the record's, with the record's TF32
    (tf32_text), weights and VAE beside it. Introduced in 01_baseline.ipynb."""
    for gpu_name, name, _, results in committed_ladders(get_spec(model).key, root):
        if name == ladder and gpu in (None, gpu_name):
            for result in results:
                if result.step == rung:
                    return result
    raise FastdiffError(f"No committed result of {rung!r} on {LADDER_TITLES.get(ladder, ladder)}"
                        f" for {model}" + (f" on {gpu}" if gpu else "") + ": fdh.course."
                        "reference_numbers(model) prints what is committed.")


def reference_rate(gpu: str | None = None, root: str | os.PathLike | None = None
                   ) -> tuple[str, float]:
    """(device name, TFLOP/s): the highest dense bf16 matmul rate this project measured on a
    GPU (results/<gpu>/matmul.jsonl, fdh.measure_matmul_tflops at 8192x8192), on `gpu` (a
    folder name) or on the first GPU folder that has one. Introduced in 01_baseline.ipynb."""
    base = _root(root)
    for path in sorted(base.glob(f"{gpu or '*'}/matmul.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows:
            best = max(rows, key=lambda row: row["bf16_matmul_tflops"])
            return best["device"], best["bf16_matmul_tflops"]
    raise FastdiffError(f"No committed matmul rate{' on ' + gpu if gpu else ''} "
                        "(results/<gpu>/matmul.jsonl).")


# the names a results folder holds (the record first: it marks a folder as one of ours)
RESULTS_FOLDER = ("results.jsonl", "images", "ladder.png", "memory.png", "reference.json",
                  "tuning")


def slug(name: str) -> str:
    """A step name as a file name's part: "+ int8 dynamic" -> "int8-dynamic"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "step"


def save_result(result: Result, out: str | os.PathLike, index: int | None = None) -> Path:
    """Keep one Result in the folder `out`: its image as out/images/<index>_<step>.png
    (recorded in result.image_path, relative to `out`), then its record appended to
    out/results.jsonl. `index` defaults to the number of records already there. A folder
    holding files of someone else's is refused, and an image is never written over: a name
    taken (an earlier run's) gets a suffix. Returns the results file."""
    out = output_folder("out", out, RESULTS_FOLDER)
    store = out / "results.jsonl"
    if index is None:
        index = len(load_results(store)) if store.exists() else 0
    if result.image is not None:
        image_path = out / "images" / f"{index}_{slug(result.step)}.png"
        taken = 1
        while image_path.exists():
            taken += 1
            image_path = image_path.with_name(f"{index}_{slug(result.step)}-{taken}.png")
        image_path.parent.mkdir(parents=True, exist_ok=True)
        result.image.save(image_path)
        result.image_path = image_path.relative_to(out).as_posix()
    return save_results(result, store)


def chart_file(name: str, value: Any) -> Path:
    """A PNG chart to write: new, or a PNG that matplotlib wrote (any other file is refused)."""
    return checks.output_file(name, value, "ladder.png", lambda p: checks.file_starts(
        p, b"\x89PNG", b"Software\x00Matplotlib"), "a PNG chart that matplotlib wrote")


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Write the figure as PNG (dpi 120), creating folders, never over a file that is not a
    matplotlib PNG; returns the path. run_ladder(out=...) saves its charts with it, into a
    folder the command line was given (a notebook saves a chart with the Figure's own
    `savefig`)."""
    path = chart_file("path", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path
