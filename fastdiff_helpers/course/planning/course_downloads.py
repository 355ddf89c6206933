"""What each notebook downloads: the weight files of each model in the dtypes its cells run it
in, from the course clock's record (clock_record.py, with the GPU cells of clock_gpu.py), for
`python -m fastdiff_helpers download` and the plan.

Introduced in 00_setup.ipynb (through the download command its text names).
"""

from __future__ import annotations

import json
from typing import Iterable

from ...errors import FastdiffError
from ...models.dtypes import element_bytes, fp32_or_half
from ...models.downloads import repo_folders, wanted_variant
from ...models.fit import part_parameters
from ...models.presets import HUB_FILES, MODELS
from .gpus import fits
from .published import BLOG_LOADING
from .clock import cell_work  # the clock's own reading: the record, GPU cells in place
from .clock_record import RECORDED
from .clock_gpu import GPU_WORK

__all__ = ["course_downloads", "notebook_needs", "for_card", "VAE_NOTEBOOKS", "download_bytes",
           "files_dtype"]

# The record names the models a cell runs, not the VAE it loads them with: the blog's ladder
# swaps in the fp16-fix VAE for SDXL and SSD-1B (published.BLOG_LOADING). The notebooks that run
# it (run_ladder / warm_ladder / first_image_in_new_process on the blog's ladder); the core path
# runs the course's ladder only (issue 59):
VAE_NOTEBOOKS = ("17_all_models.ipynb",)


def files_dtype(model: str, dtype) -> str:
    """The dtype of the files a load of `model` in `dtype` fetches: "fp16" for the fp16
    variant, else the repository's plain files' ("fp32"; "bf16" for Flux)."""
    hub_id, _ = repo_folders(model)
    return "fp16" if wanted_variant(hub_id, dtype) else HUB_FILES.get(hub_id, ("fp32", 0))[0]


def download_bytes(model: str, dtype: str) -> int:
    """The bytes of the safetensors files from_pretrained fetches for `model` (a key of
    fdh.MODELS, or "fp16-fix" for that VAE) loaded in `dtype`: parameters of the full-size
    architecture times the bytes per element of the files' dtype (a safetensors file is the
    raw tensors plus a header of a few hundred kB, left out). Offline, from the meta device;
    what the download command and the plan count."""
    return element_bytes(files_dtype(model, dtype)) * sum(part_parameters(model).values())


def _precision(recipe: str) -> str | None:
    """"fp32" or "half" for a compiled recipe as the record writes it (clock_gpu.py
    recipe_id: the fields away from the defaults, dtype fp32 left out); None where it does not
    say (a compile outside fdh.apply: its pipeline's own loads and calls say it)."""
    try:
        fields = json.loads(recipe)
    except (json.JSONDecodeError, TypeError):
        return None
    return fp32_or_half(fields.get("dtype", "fp32"))


def notebook_needs(notebook: str, works: list[tuple[str, dict]] | None = None
                   ) -> set[tuple[str, str]]:
    """(model, "fp32" | "half") for each model `notebook` calls or benchmarks, in the
    precisions it runs it: the record's kinds, and for a compiled call the dtypes of the
    notebook's compiles of that model."""
    works = cell_work(notebook) if works is None else works
    compiled: dict[str, set[str]] = {}
    for _, work in works:
        for model, *_, recipe in work.get("compiles", []):
            precision = _precision(recipe)
            if precision:
                compiled.setdefault(model, set()).add(precision)
    needs: set[tuple[str, str]] = set()
    for _, work in works:
        for model, kind, *_ in work.get("benchmarks", []) + work.get("calls", []):
            kinds = compiled.get(model, set()) if kind == "compiled" else {kind}
            needs.update((model, k) for k in kinds)
    return needs


def course_downloads(notebooks: Iterable[str] | None = None,
                     works: dict[str, list[tuple[str, dict]]] | None = None
                     ) -> list[tuple[str, str, int, list[str]]]:
    """What the course (or `notebooks`, names or their two-digit numbers) downloads:
    (model, files' dtype, bytes, notebooks that need them), a row per model and files dtype,
    in fdh.MODELS order. A notebook needs a model's fp32 files where it runs it in fp32 (or
    TF32), its fp16 files where in half precision (the plain files where the repo has no fp16
    ones: PixArt's fp32, Flux's bf16); the fp16-fix VAE goes with SDXL and SSD-1B in the
    notebooks that run the blog's ladder (VAE_NOTEBOOKS). Bytes: download_bytes.
    `works`: {notebook: [(cell, work)]} in place of the clock's (a testing aid)."""
    known = sorted(RECORDED.keys() | GPU_WORK.keys()) if works is None else sorted(works)
    chosen = known if notebooks is None else [_notebook(n, known) for n in notebooks]
    rows: dict[tuple[str, str], list[str]] = {}
    for notebook in chosen:
        needs = notebook_needs(notebook, None if works is None else works[notebook])
        for model, precision in needs:
            files = files_dtype(model, "fp32" if precision == "fp32" else "bf16")
            rows.setdefault((model, files), []).append(notebook)
            if notebook in VAE_NOTEBOOKS and "vae" in BLOG_LOADING.get(model, {}):
                vae = BLOG_LOADING[model]["vae"]
                rows.setdefault((vae, files_dtype(vae, "fp32")), []).append(notebook)
    order = list(MODELS)
    key = lambda mf: (order.index(mf[0]) if mf[0] in order else len(order), mf)  # noqa: E731
    return [(model, files, download_bytes(model, files), sorted(set(rows[(model, files)])))
            for model, files in sorted(rows, key=key)]


def for_card(rows, profile):
    """(the rows a card needs, a line for each left out): not the files of a model in a
    precision that does not fit the card (its cells are skipped there: the plan's rule)."""
    kept, left = [], []
    for row in rows:
        # fp32 files serve fp32 cells, and half-precision ones where the repo has no others
        dtype = ("fp32" if row[1] == "fp32" and row[0] in MODELS
                 and files_dtype(row[0], "bf16") != "fp32" else profile.half)
        ok, need = fits(profile, row[0], dtype) if row[0] in MODELS else (True, "")
        if ok:
            kept.append(row)
        else:
            left.append(f"fastdiff: left out for {profile.name}: {row[0]}'s {row[1]} files "
                        f"({row[0]} in {dtype} does not fit: {need})")
    return kept, left


def _notebook(name: str, known: list[str]) -> str:
    found = [n for n in known if n == name or n.split("_")[0] == str(name).zfill(2)]
    if not found:
        raise FastdiffError(f"Unknown notebook {name!r}: give a name or its number, one of "
                            f"{', '.join(n.split('_')[0] for n in known)}.")
    return found[0]


def before_after(rows: list[tuple[str, str, int, list[str]]]) -> tuple[int, int]:
    """(bytes as the course downloaded before: every model's fp32 files, once; bytes of
    `rows`: each model's files in the dtypes its notebooks run it in)."""
    models = {model for model, *_ in rows}
    before = sum(download_bytes(m, "fp32") for m in models)
    return before, sum(b for _, _, b, _ in rows)


def table(rows: list[tuple[str, str, int, list[str]]]) -> str:
    """The rows as the download command prints them, with the total and the GB before."""
    lines = [f"{'model':14} {'files':6} {'GB':>6}  notebooks"]
    for model, files, nbytes, notebooks in rows:
        lines.append(f"{model:14} {files:6} {nbytes / 1e9:6.1f}  "
                     + " ".join(n.split("_")[0] for n in notebooks))
    before, after = before_after(rows)
    lines.append(f"{'total':21} {after / 1e9:6.1f}  (fp32 files for every model, as before: "
                 f"{before / 1e9:.1f} GB)")
    return "\n".join(lines)
