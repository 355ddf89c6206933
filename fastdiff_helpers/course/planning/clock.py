"""The course clock: what each notebook compiles and runs on a GPU, and the wait it means,
estimated from constants measured on GPUs or published (each named), never measured as a
whole.

Introduced in docs/workshop.md ("The course clock"); `python -m fastdiff_helpers clock` prints it.
What a notebook does is counted, not guessed: its smoke run on the CPU records every pipeline
load and call, every benchmark and every compile (models/clock_log.py), per cell, and
clock_record.py holds that record, which tests/test_notebooks.py checks against each smoke run.
A cell that does more on a GPU than in smoke mode (tagged "gpu", or with a smoke branch) has
its GPU work declared in clock_gpu.py instead, which a test ties to the cells that need it.

The course runs top to bottom in one compile cache (fdh.course.use_course_cache): a graph compiled by
an earlier cell is a cache hit later (dynamo traces again, inductor loads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from .autotune import (GRAPH_OPS, REGIONAL_S, SHAPE_S, VAE_OPS, WITHOUT_TUNING,
                       graph_ops_of, graph_seconds)
from .gpus import PROFILES, TEMPLATE_SMS
from ...models.presets import get_spec
from ...techniques.syncs import schedule_moves
from .shapes import gemm_shapes
from .image_time import kind_seconds
from . import clock_gpu
from .clock_gpu import GPU_WORK, half_on_a_gpu
from .clock_record import RECORDED

__all__ = ["summarize", "estimate", "course_table", "cell_work", "image_s"]

# --- the constants (H100 SXM, the course's native sizes, 30 steps) --------------------------
# a cache hit: dynamo traces the graph again and inductor loads it; SDXL's UNet and VAE decode
# took 14.2 s so on the H200 ('+ no sync' after '+ fused QKV', the same graphs: 12.4 s of
# dynamo, 1.9 s of inductor; results/h200/sdxl-course/results.jsonl, slot-2026-11-29.md)
CACHE_HIT_S = 14.2
CACHE_HIT_PER_OP = CACHE_HIT_S / (GRAPH_OPS["sdxl", "denoiser"] + VAE_OPS)
ops = graph_ops_of  # a graph's compile and a cache hit's tracing scale with its ops
# load + apply of a full-size pipeline on the H100 (results/h100-80gb-hbm3/sdxl/results.jsonl,
# load_s): 17.3 s the first in a process, 0.9-1.1 s after
FIRST_LOAD_S, LOAD_S = 17.3, 1.1
CALLS_PER_BENCHMARK = 7  # the cold start, one warm-up, 5 timed runs (course_settings on a GPU)


def image_s(model: str, kind: str, gpu: Any = "h100") -> float:
    """Estimated seconds of one image of the clock's `kind` on `gpu` (native size, the course's
    steps): fdh.course.image_seconds, the one estimate (course/planning/image_time.py)."""
    return kind_seconds(gpu, model, kind)


# --- a notebook's record -----------------------------------------------------------------------

def summarize(events: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """One smoke run's events (clock_log's JSON lines, with the test's {"event": "cell"} marks)
    per cell: its loads, compiles, the frames dynamo compiled (a trace for fdh.graph_breaks left
    out), benchmarks and the calls outside them, in the form clock_record.py keeps. Cells that
    did none of these are left out."""
    cells: dict[str, dict[str, Any]] = {}
    cell, depth, explaining = None, 0, False
    for event in events:
        kind = event.get("event")
        if kind == "cell":
            cell, depth, explaining = event["id"], 0, False
            continue
        if cell is None:
            continue
        work = cells.setdefault(cell, {"loads": [], "compiles": [], "frames": 0,
                                       "benchmarks": [], "calls": []})
        if kind == "load":
            work["loads"].append(event["model"])
        elif kind == "compile":
            work["compiles"].append([event["model"], event["mode"], event["scope"],
                                     event["vae"], event["tunes"], event["recipe"]])
        elif kind in ("explain", "explain_end"):
            explaining = kind == "explain"
        elif kind == "frame" and not explaining:
            work["frames"] += 1
        elif kind == "benchmark":
            depth += 1
            work["benchmarks"].append([event["model"], event["kind"], event["profile"]])
        elif kind == "benchmark_end":
            depth = max(depth - 1, 0)
        elif kind == "call" and depth == 0:
            work["calls"].append([event["model"], event["kind"]])
    return {c: w for c, w in cells.items() if any(w.values())}


# the recipe fields a compiled VAE decode's graph depends on (the denoiser-only ones, a step
# cache, a guidance stop, sync removal, the compile scope, do not reach it)
VAE_FIELDS = ("dtype", "tf32", "attention", "channels_last", "fullgraph", "dynamic",
              "inductor_flags", "fuse_qkv", "quantize", "quant_filter", "conv1x1_to_linear")


def _denoiser_part(model: str, recipe: str) -> str:
    """The recipe as the denoiser's graph sees it: sync removal changes no graph where the
    model's own pipeline and scheduler have nothing to move (techniques/syncs.py,
    schedule_moves): SDXL's '+ no sync' after '+ fused QKV' compiled as a cache hit on the
    H200, 14.2 s (results/h200/slot-2026-11-29.md)."""
    try:
        fields = json.loads(recipe)
    except (json.JSONDecodeError, TypeError):
        return recipe
    spec = get_spec(model)
    if fields.get("no_sync") and not schedule_moves(spec.pipeline_class,
                                                    spec.scheduler.class_name)[0]:
        fields.pop("no_sync")
    return json.dumps(fields, sort_keys=True)


def _vae_part(recipe: str) -> str:
    try:
        fields = json.loads(recipe)
    except (json.JSONDecodeError, TypeError):
        return recipe
    return json.dumps({k: v for k, v in fields.items() if k in VAE_FIELDS}, sort_keys=True)


def read_log(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# --- the estimate ------------------------------------------------------------------------------

def cell_work(notebook: str) -> list[tuple[str, dict]]:
    """(cell, work) in notebook order: the recorded smoke work, with the declared GPU work in
    place of the cells that do more on a GPU."""
    recorded = dict(RECORDED.get(notebook, {}))
    declared = GPU_WORK.get(notebook, {})
    order = list(recorded) + [c for c in declared if c not in recorded]

    def work(cell: str) -> dict:
        said = declared.get(cell, {})
        if not said.get("as_recorded"):
            return said if cell in declared else recorded[cell]
        mine = recorded.get(cell, {})
        return half_on_a_gpu(mine) if said.get("half") else mine

    return [(c, work(c)) for c in order]


def estimate(notebooks: Iterable[str] | None = None, autotune: bool = False,
             committed: frozenset = frozenset(), sms: int = PROFILES["h100"].sms,
             works: dict[str, list[tuple[str, dict]]] | None = None,
             gpu: Any = "h100") -> dict[str, Any]:
    """The estimated GPU wait of `notebooks` (default: all, in order), run top to bottom in one
    compile cache on `gpu` (a profile key or GpuProfile; `sms` SMs): per notebook and cell,
    compile seconds (as a 16-core host compiles: the H200's, measured), tuning seconds, image seconds
    (loads, benchmarks, calls; fdh.course.image_seconds on `gpu`), and the longest cell.

    A compile's graphs are compiled by the first call after it (the frames dynamo compiles,
    counted in the cell they happen in): a graph of a recipe compiled earlier in the course is
    a cache hit (CACHE_HIT_S), a new one costs autotune.graph_seconds (REGIONAL_S / 2 a block
    kind for a regional compile), and frames beyond the compiled parts are recompiles (new shapes,
    guards), each a new graph. A compile that would tune runs its default-mode equivalent
    (the autotune rule) unless `autotune` (the learner switched it on) or `committed` (recipe
    ids a tuning bundle covers: read, not tuned); tuning costs the model's GEMM/conv shapes at
    the H200's measured seconds a shape, once per model and recipe, plus coordinate descent,
    not measured (left out). `works`: {name: [(cell, work)]} in place of the notebooks (a
    ladder's work, for `make demo`). Every figure is an estimate."""
    seen: set = set()
    tuned: set = set()
    shapes: dict[str, int] = {}
    out: dict[str, Any] = {"notebooks": {}, "autotune": autotune}
    for notebook in works or notebooks or sorted(RECORDED.keys() | GPU_WORK.keys()):
        cells, loads, pending, steps = {}, 0, [], []
        last_model = "sdxl"
        for cell, work in (works[notebook] if works else cell_work(notebook)):
            if work.get("if_autotune") and not autotune:
                continue
            tune_s = 0.0
            for model, mode, scope, vae, tunes, recipe in work.get("compiles", []):
                run_tuned = tunes and (autotune or recipe in committed)
                ran = mode if run_tuned else WITHOUT_TUNING.get(mode, mode)
                keys = [(model, "denoiser", _denoiser_part(model, recipe), ran, scope)]
                if vae:  # the decode's graph depends on fewer of the recipe's fields
                    keys.append((model, "vae", _vae_part(recipe), ran))
                for key in keys:
                    pending.append((key in seen, model, key[1], scope))
                    seen.add(key)
                steps.append(len(keys))
                last_model = model
                if run_tuned and recipe not in committed and (model, recipe) not in tuned:
                    tuned.add((model, recipe))
                    if sms >= TEMPLATE_SMS:
                        shapes.setdefault(model, gemm_shapes(model))
                        tune_s += shapes[model] * SHAPE_S
            frames, graphs, hits = work.get("frames", 0), 0, 0
            costs: list[float] = []  # each compiled part first called here, in order
            while frames and pending:  # the compiled parts, first called here, one frame each
                hit, part_model, part, scope = pending.pop(0)
                frames -= 1
                hits, graphs = hits + hit, graphs + (not hit)
                costs.append(ops(part_model, part) * CACHE_HIT_PER_OP if hit else
                             REGIONAL_S / 2 if scope != "full" else graph_seconds(part_model, part))
            # recompiles (new shapes, guards: new graphs), of the cell's or notebook's denoiser
            model = next((m for m, *_ in work.get("compiles", [])), last_model)
            costs += [graph_seconds(model, "denoiser")] * frames
            graphs += frames
            compile_s = sum(costs)
            load_s = 0.0
            for _ in work.get("loads", []):
                load_s += FIRST_LOAD_S if loads == 0 else LOAD_S
                loads += 1
            images = sum((CALLS_PER_BENCHMARK + int(profile)) * image_s(model, kind, gpu)
                         for model, kind, profile in work.get("benchmarks", []))
            images += sum(image_s(model, kind, gpu) for model, kind in work.get("calls", []))
            # the longest step: one compile (its parts, said before by fdh.compile_pipeline,
            # the progress bar's clock moving) and its timed calls; the helpers print per step
            longest = max([sum(costs[i:i + n]) for i, n in _spans(steps, len(costs))] or [0.0])
            step_images = max([CALLS_PER_BENCHMARK * image_s(m, k, gpu) for m, k, _ in
                               work.get("benchmarks", [])] or [0.0])
            cells[cell] = {"compile_s": compile_s, "tune_s": tune_s, "images_s": images,
                           "load_s": load_s, "graphs": graphs, "cache_hits": hits,
                           "total_s": compile_s + tune_s + images + load_s,
                           "longest_step_s": longest + step_images + (tune_s if steps else 0)}
            steps = []
        out["notebooks"][notebook] = {
            "cells": cells, **{k: sum(c[k] for c in cells.values()) for k in
                               ("compile_s", "tune_s", "images_s", "load_s", "graphs",
                                "cache_hits", "total_s")},
            "longest_cell": max(cells.items(), key=lambda kv: kv[1]["total_s"],
                                default=(None, {"total_s": 0.0}))}
    out["total_s"] = sum(n["total_s"] for n in out["notebooks"].values())
    return out


def ladder_estimate(model: str, ladder: str, autotune: bool = False) -> dict[str, Any]:
    """A ladder run once on a GPU from an empty cache (each step loaded, compiled, benchmarked
    and profiled, as `make demo` runs it): the estimate's totals (estimate())."""
    work = clock_gpu.ladder(model, ladder, profile=True)
    tuning = clock_gpu.ladder(model, ladder, profile=True, autotuning=True)
    return estimate(autotune=autotune, works={ladder: [("steps", work),
                                                      ("autotuning", tuning)]})["notebooks"][ladder]


def _spans(steps: list[int], total: int):
    """(start, length) of each step's parts among `total` costs; what is left, one span."""
    start = 0
    for n in steps:
        if start >= total:
            return
        yield start, n
        start += n
    if start < total:
        yield start, total - start


def _m(seconds: float) -> str:
    return f"{seconds / 60:.0f}" if seconds >= 60 else f"{seconds / 60:.1f}"


def course_table(sms: int = PROFILES["h100"].sms) -> str:
    """The table of docs/workshop.md: per notebook the graphs it compiles new and the estimated minutes on
    an H100 from an empty compile cache, with autotuning off (the course's default) and
    switched on, and with the committed tuning (none of the H100's yet)."""
    off, on = estimate(sms=sms), estimate(autotune=True, sms=sms)
    lines = ["| notebook | new graphs (cache hits) | est. minutes, autotuning off | "
             "of it compiling | longest cell (min) | longest step (min) | "
             "est. minutes, autotuning on |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, n in off["notebooks"].items():
        cell, longest = n["longest_cell"]
        step = max([c["longest_step_s"] for c in n["cells"].values()] or [0.0])
        lines.append(f"| {name} | {n['graphs']} ({n['cache_hits']}) | {_m(n['total_s'])} | "
                     f"{_m(n['compile_s'])} | {_m(longest['total_s'])} ({cell}) | {_m(step)} | "
                     f"{_m(on['notebooks'][name]['total_s'])} |")
    lines.append(f"| **all** | {sum(n['graphs'] for n in off['notebooks'].values())} | "
                 f"**{_m(off['total_s'])}** | "
                 f"{_m(sum(n['compile_s'] for n in off['notebooks'].values()))} | | | "
                 f"{_m(on['total_s'])} + coordinate descent |")
    return "\n".join(lines)
