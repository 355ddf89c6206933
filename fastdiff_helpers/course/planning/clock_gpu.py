"""What the cells that do more on a GPU than in smoke mode do there, for the course clock
(course/planning/clock.py): declared here, in the form of clock_record.py, cell by cell. A cell is
here when it is tagged "gpu" or branches on smoke mode or the device; tests/test_clock.py ties
this list to the notebooks (every such cell is here, with its reason when it does nothing).

Each entry is built from the recipes the cell runs, as a GPU runs them (Recipe.for_device).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...models.dtypes import fp32_or_half
from .gpus import PROFILES
from .autotune import is_tuning_step, tunes
from .ladders import LADDERS
from ...techniques.recipe import Recipe

__all__ = ["GPU_WORK", "NOTHING"]

COURSE = dict(LADDERS["course"])
FLUX = dict(LADDERS["flux"])
NOTHING = "nothing that takes GPU time to speak of"
_ID_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Recipe) if f.name != "compile"}


def recipe_id(recipe: dict | None) -> str:
    """A short, stable name of a compiled recipe (a Recipe.to_dict(): "compile" and the fields
    away from their defaults), telling its graphs from another recipe's in the course clock's
    record; "compile_pipeline" for a compile outside fdh.apply."""
    if recipe is None:
        return "compile_pipeline"
    return json.dumps({k: v for k, v in recipe.items() if _ID_DEFAULTS.get(k, "?") != v},
                      sort_keys=True, default=str)


def _kind(recipe: Recipe) -> str:
    return "compiled" if recipe.compile else fp32_or_half(recipe.dtype)


def run(model: str, recipe: Recipe, benchmarks: int = 1, calls: int = 0, profile: bool = False,
        frames: int | None = None, load: bool = True) -> dict[str, Any]:
    """A fresh pipeline with `recipe`: loaded, compiled (its parts first called here, plus
    `frames` beyond them: recompiles), benchmarked and called."""
    gpu = recipe.for_device("cuda", PROFILES["h100"].capability)[0]  # the clock's card
    work: dict[str, Any] = {"loads": [model] if load else [], "compiles": [], "frames": 0,
                            "benchmarks": [[model, _kind(gpu), profile]] * benchmarks,
                            "calls": [[model, _kind(gpu)]] * calls}
    if gpu.compile:
        work["compiles"].append([model, gpu.compile, gpu.compile_scope, gpu.compile_vae,
                                 tunes(gpu.compile, gpu.inductor_flags),
                                 recipe_id(gpu.to_dict())])
        work["frames"] = (1 + int(gpu.compile_vae)) if frames is None else frames
    return work


def merge(*works: dict[str, Any], frames: int = 0, calls: list | None = None,
          loads: list | None = None, if_autotune: bool = False, why: str = ""
          ) -> dict[str, Any]:
    """The work of `works` together, plus `frames` compiled (recompiles), `calls` and `loads`
    of their own."""
    out: dict[str, Any] = {"loads": list(loads or []), "compiles": [], "frames": frames,
                           "benchmarks": [], "calls": list(calls or [])}
    for work in works:
        for key in ("loads", "compiles", "benchmarks", "calls"):
            out[key] += work.get(key, [])
        out["frames"] += work.get("frames", 0)
    if if_autotune:
        out["if_autotune"] = True
    if why:
        out["why"] = why
    return out


def nothing(why: str = NOTHING) -> dict[str, Any]:
    return merge(why=why)


def as_recorded(why: str, half: bool = False) -> dict[str, Any]:
    """A cell that branches on the device or smoke mode but whose smoke record counts what it
    does on a GPU (the sizes and modes differ, not the work). `half`: its recipe is bf16 on a
    GPU and fp32 on a CPU, so its fp32 work is half-precision work there (half_on_a_gpu)."""
    return {"as_recorded": True, "why": why, **({"half": True} if half else {})}


def half_on_a_gpu(work: dict[str, Any]) -> dict[str, Any]:
    """A smoke record's work as a GPU runs it where the recipe is bf16 there and fp32 on a CPU:
    fp32 images are half-precision ones, and fp32 compiled recipes are bf16."""
    def bf16(rid: str) -> str:
        fields = {} if rid == "compile_pipeline" else json.loads(rid)
        return rid if "dtype" in fields or not fields else recipe_id({**fields, "dtype": "bf16"})

    def half(entries: list) -> list:
        return [[model, "half" if kind == "fp32" else kind, *rest]
                for model, kind, *rest in entries]

    return {**work, "benchmarks": half(work.get("benchmarks", [])),
            "calls": half(work.get("calls", [])),
            "compiles": [[*c[:-1], bf16(c[-1])] for c in work.get("compiles", [])]}


def ladder(model: str, name: str, steps: list[str] | None = None, profile: bool = False,
           autotuning: bool = False) -> dict[str, Any]:
    """run_ladder on a GPU: every step (or `steps`) on a fresh pipeline. A step that is
    autotuning alone runs only with autotuning on: `autotuning=True` gives those alone."""
    rungs = LADDERS[name]
    works = []
    for i, (step, recipe) in enumerate(rungs):
        if steps is not None and step not in steps:
            continue
        alone = bool(i) and is_tuning_step(rungs[i - 1][1], recipe)
        if alone == autotuning:
            works.append(run(model, recipe, profile=profile))
    return merge(*works, if_autotune=autotuning)


def _sized(recipe: Recipe, **change: Any) -> Recipe:
    return dataclasses.replace(recipe, **change)


M = "sdxl"
GPU_WORK: dict[str, dict[str, dict[str, Any]]] = {
    "01_baseline.ipynb": {"nb01-15": nothing("one bf16 matmul rate: seconds")},
    "16_where_the_time_goes.ipynb": {
        "nb14-12": merge(*(run(M, COURSE[s], calls=2) for s in
                           ("+ fused QKV", "+ no sync", "+ int8 dynamic", "+ fp8 dynamic"))),
        "nb14-12+autotune": merge(run(M, COURSE["+ autotune"], calls=2), if_autotune=True),
    },
    "02_precision.ipynb": {"nb02-21": run(M, Recipe(dtype="fp16"), benchmarks=0, calls=1)},
    # the CUDA kernels pinned in turn on the pipeline the notebook already holds
    "03_attention.ipynb": {"nb03-11": merge(*(run(M, Recipe(dtype="bf16", attention=a), load=False)
                                              for a in ("sdpa-flash", "sdpa-efficient",
                                                        "sdpa-cudnn")))},
    "04_torch_compile.ipynb": {
        # a plain compile (compile-plain): on a GPU the UNet and the VAE decode, both compiled
        # at nb04-11's first call; their wait is counted with the compile, nb04-11 benchmarks
        "compile-plain": run(M, COURSE["+ compile"], benchmarks=0, load=False),
        "nb04-11": merge({"benchmarks": [[M, "compiled", False]]}),
    },
    "05_cold_start.ipynb": {
        "compile-bench": run(M, COURSE["+ compile"]),  # the whole denoiser, not its blocks
        "nb04-13": run(M, COURSE["+ compile"]),        # after dynamo's reset: the cache's
        # after dynamo's reset, in a folder that holds only the loaded artifacts: their hits
        "from-artifacts": run(M, COURSE["+ compile"]),
        "nb04-15": nothing("error_on_recompile: the 1.5x size raises before it compiles"),
        "recompile-report": merge(frames=2, calls=[[M, "compiled"]] * 4),  # 1.5x: a recompile
        "full-vs-regional": merge(*(run(M, _sized(COURSE["+ compile"], compile_scope=s))
                                    for s in ("full", "regional"))),
    },
    "12_cuda_graphs.ipynb": {
        # a plain torch.compile of the UNet (05's compile rung in reduce-overhead mode): lazy,
        # so its graph is compiled by the benchmark's first call, declared with the benchmark
        # (a cell the smoke run records nothing for would be counted after the recorded ones)
        "reduce-overhead": nothing("compiles lazily: the benchmark below compiles the graph"),
        "nb16-05": run(M, _sized(COURSE["+ compile"], compile_vae=False), load=False),
        "nb16-07": merge(frames=1, calls=[[M, "compiled"]] * 2),  # a new shape: a recompile
        "nb16-09": run(M, _sized(COURSE["+ compile"], compile_vae=False,
                                 compile_scope="regional"), benchmarks=0, calls=1),
    },
    "14_lora_hotswap.ipynb": {
        "lora-files": as_recorded("loads in bf16 on a GPU, in fp32 on a CPU", half=True),
        "eager": as_recorded("bf16 on a GPU, fp32 on a CPU: the same calls", half=True),
        # a plain torch.compile of the UNet with LoRA A in reduce-overhead mode: lazy, so its
        # graph is compiled by the benchmark's first call. A LoRA is no recipe field: the
        # recipe alone names it, one no other cell of the course compiles
        "hotswap": nothing("compiles lazily: the benchmark below compiles the graph"),
        "first": run(M, Recipe(dtype="bf16", attention="sdpa", compile="reduce-overhead",
                               fullgraph=True, compile_vae=False), load=False),
        # smoke mode switches to one LoRA, a GPU to two and back: one more recompile
        "without": as_recorded("one switch fewer in smoke mode than on a GPU"),
    },
    "06_fused_qkv.ipynb": {  # the course's + compile (a cache hit after 04) and + fused QKV
        "nb05-11": merge(*(run(M, COURSE[s]) for s in ("+ compile", "+ fused QKV"))),
    },
    "07_gpu_syncs.ipynb": {
        "find-syncs": merge(calls=[["sd15", "half"]]),  # one image in sync debug mode
        "nb06-04": merge(calls=[["sd15", "half"]]),
        "nb06-06": merge(calls=[["sd15", "half"]]),
        "nb06-09": merge(calls=[["sd15", "half"]]),
        "nb06-12": merge(*(run("sd15", COURSE[s]) for s in ("+ fused QKV", "+ no sync"))),
    },
    "08_int8_quantization.ipynb": {"nb07-15": ladder(M, "course",
                                                     ["+ no sync", "+ int8 dynamic"])},
    "15_fp8_hopper.ipynb": {
        "nb15-12": ladder(M, "course", ["+ no sync", "+ int8 dynamic", "+ fp8 dynamic"]),
        # a stock bf16 pipeline timed eager, quantized to fp8 by hand, timed again
        "nb15-14": run(M, Recipe(dtype="bf16", attention="sdpa")),
        "fp8-technique": nothing("quantize_ on the loaded pipeline: seconds"),
        "fp8-eager": run(M, Recipe(dtype="bf16", attention="sdpa", quantize="fp8-dynamic-row",
                                   quant_filter="fastdiff"), load=False),
    },
    "09_fewer_denoiser_calls.ipynb": {
        "nb12-01": nothing("picks the dtype: bf16 on a GPU, fp32 on a CPU"),
        "nb12-05": as_recorded("bf16 on a GPU, fp32 on a CPU: the same calls", half=True),
        "nb12-15": as_recorded("reduce-overhead on a GPU, default on a CPU: the same graphs; "
                               "bf16 there", half=True),
        **{cell: as_recorded("bf16 on a GPU, fp32 on a CPU: the same calls", half=True)
           for cell in ("nb12-07", "nb12-08", "nb12-13", "guidance-callback", "nb12-17",
                        "nb12-19")},
        "nb12-11": nothing("runs only with pretrained SDXL and the few-step LoRA files cached"),
        # the compile rung as 05 compiles it (a cache hit on the core path), then with the step
        # cache and the guidance stop: two paths at two batch sizes
        "nb12-21": merge(run(M, COURSE["+ compile"], frames=2),
                         run(M, _sized(COURSE["+ compile"], cache_every=3, guidance_stop=0.5),
                             frames=4)),
    },
    "17_all_models.ipynb": {
        "nb08-03": nothing("lists the steps; the next cells run them"),
        "nb08-05": ladder("sdxl", "blog"), "nb08-07": ladder("sd15", "blog"),
        "nb08-09": ladder("ssd1b", "blog"), "nb08-11": ladder("pixart", "blog"),
        "nb08-17": ladder("sdxl", "course"),
        "nb08-17+autotune": ladder("sdxl", "course", autotuning=True),
    },
    "18_scale_out.ipynb": {
        "prompts": nothing("builds the prompts and the recipe"),
        "launch": nothing("one GPU: nothing to split (on K GPUs, K processes)"),
        # batch sizes 1, 2, 4 and 8 over the 8 prompts: 8 + 4 + 2 + 1 calls, a load each
        "gpu-sweep": merge(calls=[["sd15", "half"]] * 15, loads=["sd15"] * 4),
    },
    "11_fitting_your_gpu.ipynb": {
        "peak": as_recorded("bf16 on a GPU, fp32 on a CPU: the same call", half=True),
        "savers": as_recorded("the memory savers' report at twice the smoke size; its calls "
                              "are the GPU's, in peak's dtype (bf16 there)", half=True),
        # model CPU offload on the bf16 pipeline, one call (the copies are not counted)
        "offload": merge(calls=[[M, "half"]]),
    },
    "19_flux.ipynb": {
        "ladder-steps": ladder("flux", "flux"),
        "hooks-cpu": nothing("the tiny model on the CPU, on any machine"),
        # the plain compile_repeated_blocks: nothing until the first call (the cell below)
        "regional-compile": nothing("marks the blocks for compile; the next cell's first call "
                                    "compiles them"),
        # the stock bf16 pipeline, its two block classes compiled (default mode, fullgraph)
        "regional-time": run("flux", Recipe(dtype="bf16", attention="sdpa", compile="default",
                                            compile_scope="regional", fullgraph=True,
                                            compile_vae=False), load=False, frames=2),
    },
    "13_autotuning.ipynb": {
        # with the switch on: the compile rung as fusion alone, then max-autotune with the blog's
        # flags (05's tuning cell, moved here)
        "autotune-gpu": merge(run(M, COURSE["+ compile"]),
                              run(M, _sized(COURSE["+ compile"], compile="max-autotune",
                                            inductor_flags=True)), if_autotune=True),
    },
}
