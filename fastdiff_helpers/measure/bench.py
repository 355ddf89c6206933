"""benchmark(): cold start, warm-up, device-correct timing, per-stage times, peak memory.

Introduced in 01_baseline.ipynb. (run_ladder is course/runs/ladder.py's, format_table results/'.)
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch

from .. import checks
from ..models.loading import FastdiffError, call_kwargs, pipeline_device, pipeline_info
from ..models.hooks import tell
from ..models.presets import DEFAULT_PROMPT
from ..techniques import current_recipe, tf32_state
from .compile_events import compiled, events_between, snapshot
from .cudagraphs import _index, cudagraph_report, cudagraph_snapshot
from .env import device_name, env_report
from ..techniques.guidance import cutoff_share
from ..techniques.step_cache import guided_steps
from .flops import count_flops, denoiser_calls
from .quality import compare_images
from .record import Result
from .timing import (StageMarks, _peak_rss_bytes, _ticking, marked, profile_ops, progress_bar,
                     steady_note, synchronize, until_steady)

__all__ = ["benchmark", "time_call", "synchronize"]


MAX_EXTRA_WARMUP = 3  # untimed calls added while the call before still compiled


def time_call(fn: Callable[[], Any], device: str | torch.device) -> tuple[Any, float]:
    """(fn(), seconds): wall-clock time of one call, synchronised before and after so every
    kernel the call queued is inside the measurement. Introduced in 01_baseline.ipynb."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def benchmark(pipe, prompt: str = DEFAULT_PROMPT, steps: int | None = None,
              height: int | None = None, width: int | None = None,
              guidance: float | None = None, runs: int = 5, warmup: int = 2, seed: int = 0,
              progress: bool = True, step: str = "custom", baseline: Any = None,
              max_runs: int | None = None, profile: bool = False,
              callback_on_step_end: Any = None):
    """Time one image the honest way and return a fdh.Result. Introduced in 01_baseline.ipynb.

    1. Cold start: the first call, timed alone (compilation happens here) -> cold_start_s.
    2. Warm-up: the cold-start call counts as the first warm-up call, so warmup=2 means the
       cold start plus 1 more untimed call (warmup=0 or 1: the cold start only).
    3. `runs` timed calls, each synchronised on a GPU -> latency_samples, latency_s (median);
       then more, up to `max_runs` (default 4 x runs), until the median is known within
       +-record.STEADY (Result.latency_uncertainty, from the order-statistic interval of the
       median). A result that never got there is flagged with its uncertainty (Result.flags).
    Every call is watched for compilation (measure/compile_events.py) and for CUDA graphs (captures,
    replays, re-records, skips and why: fdh.cudagraph_report, in compile_events["cudagraphs"]): while the last untimed call
    still compiled, up to MAX_EXTRA_WARMUP more untimed calls run (said in notes); a timed
    call that compiled is flagged (Result.compiled_during_timing). The cold start is split into
    compile (dynamo, inductor, autotuning where torch records it) and the call itself, and
    part by part (how much longer each stage's first call took than its warm median: a
    compiled UNet's compile shows in denoising, a compiled VAE decode's in vae_decode)
    (Result.cold_start_split).
    Every call uses a fresh generator seeded with `seed`, so every call makes the same image.
    Per call, stage times (text_encoding, denoising, vae_decode; medians in stages, every
    sample in stage_samples), peak memory over the timed calls (CUDA max allocated, and
    max reserved, which also counts CUDA-graph pools; on a CPU the process-lifetime peak
    RSS), with `profile` the ops that took most time in one more, untimed call under
    torch.profiler (Result.ops), FLOPs per image (fdh.count_flops) and, on a GPU, the
    achieved TFLOP/s. `baseline` (a Result or an image) fills quality via compare_images().
    After the warm-up, before timing, the listeners hear "warm" (models/hooks.py) with the
    compile events of each untimed call; one may stop the benchmark by raising (the reference
    run measures a compiled step only where its compile tuned nothing: tools/reference/run.py).
    `callback_on_step_end`: a diffusers callback of your own, passed on every call
    (fdh.call_kwargs); diffusers' CFG cut-off callbacks (SDCFGCutoffCallback,
    SDXLCFGCutoffCallback: 09_fewer_denoiser_calls.ipynb) are counted and recorded as the
    guidance stop they make (the FLOPs, Result.recipe's guidance_stop, a note).
    Errors propagate; run_ladder records them."""
    info = pipeline_info(pipe)
    checks.whole("runs", runs, 1)
    checks.whole("warmup", warmup, 0)
    max_runs = checks.whole("max_runs", max_runs, 1, none=True) or 4 * runs
    if max_runs < runs:
        raise FastdiffError(f"{checks.arg('max_runs', max_runs)} is below "
                            f"{checks.arg('runs', runs)}: give max_runs >= runs (or leave it "
                            "out: 4 x runs).")
    checks.text("step", step)
    baseline_image = getattr(baseline, "image", baseline)
    if baseline is not None and baseline_image is None:
        raise FastdiffError("The baseline Result has no image (records loaded from a file "
                            "keep only image_path); pass baseline=PIL.Image.open(path).")
    device = pipeline_device(pipe)

    def call() -> Any:
        return pipe(**call_kwargs(pipe, prompt, steps, height, width, guidance, seed,
                                  callback_on_step_end)).images[0]

    resolved = call_kwargs(pipe, prompt, steps, height, width, guidance, seed,
                           callback_on_step_end)  # checks all
    extra_warmup = max(warmup - 1, 0)
    bar = progress_bar(1 + extra_warmup + runs,
                       "cold start (compiling)" if "compile" in info.applied else "cold start",
                       disable=not progress or bool(os.environ.get("TQDM_DISABLE")))
    stage_samples: dict[str, list[float]] = {}
    compiles: dict[str, Any] = {"warmup": [], "timed": [], "extra_warmup": 0}

    graphs_before = cudagraph_snapshot(_index(device)) if device.type == "cuda" else None

    def counted(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        if graphs_before is not None:
            cudagraph_snapshot(_index(device))  # counts the replays once a graph manager exists
        before = snapshot()
        out = fn()
        return out, events_between(before, snapshot())

    tell("benchmark", pipe=pipe, profile=profile)  # the listeners' (models/hooks.py)
    try:
        with marked(pipe, StageMarks(device)) as marks:
            with _ticking(bar):  # a compile takes minutes: the bar's clock keeps moving
                (image, cold), compiles["cold"] = counted(lambda: time_call(call, device))
            cold_stages = marks.read()  # each part's first call, its compile inside
            bar.update(1)
            bar.set_description("warm-up")
            warmup_events = [compiles["cold"]]
            for _ in range(extra_warmup):
                warmup_events.append(counted(call)[1])
                bar.update(1)
            # warm up until nothing compiles any more (a second graph, a recompile), bounded
            while (compiled(last := warmup_events[-1])
                   and compiles["extra_warmup"] < MAX_EXTRA_WARMUP):
                bar.set_description("warm-up (still compiling)")
                warmup_events.append(counted(call)[1])
                compiles["extra_warmup"] += 1
            compiles["warmup"] = [events["frames"] for events in warmup_events[1:]]
            tell("warm", pipe=pipe, events=warmup_events)  # a listener may stop here
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            bar.set_description("timing")

            def one_more(u: float | None) -> None:
                bar.total += 1
                bar.set_description("timing (median +-" + (f"{u:.0%}" if u is not None
                                                             else "?") + ": one more run)")

            def timed_run() -> float:
                nonlocal image
                marks.spans.clear()  # forget the marks of the untimed calls
                (image, seconds), events = counted(lambda: time_call(call, device))
                compiles["timed"].append(events["frames"])
                for stage, value in marks.read().items():
                    stage_samples.setdefault(stage, []).append(value)
                bar.update(1)
                return seconds

            samples = until_steady(timed_run, runs, max_runs, one_more)
        compiles["cudagraphs"] = cudagraph_report(pipe, since=graphs_before)
        ops = profile_ops(call, device) if profile else {}
    finally:
        bar.close()
        tell("benchmark_end", pipe=pipe)

    notes: list[str] = list(info.notes)  # what fdh.apply changed for this device
    if compiles["extra_warmup"]:
        notes.append(f"{compiles['extra_warmup']} extra warm-up call(s): the call before still "
                     "compiled" + (f" (stopped at {MAX_EXTRA_WARMUP})" if compiled(last) else ""))
    if (settled := steady_note(samples, runs, max_runs)) is not None:
        notes.append(settled)
    if any(compiles["timed"]):
        notes.append(f"COMPILED DURING TIMING: timed calls compiled {compiles['timed']} frame(s); "
                     "these samples include compilation (see recompile_reasons())")
    cold_events = compiles["cold"]
    cold_split = {key: cold_events[key] for key in ("compile_s", "dynamo_s", "inductor_s",
                                                    "autotune_s")}
    cold_split["call_s"] = max(cold - cold_events["compile_s"], 0.0)
    stages = {k: statistics.median(v) for k, v in stage_samples.items()}
    for stage, seconds in cold_stages.items():
        if stage in stages:
            cold_split[f"{stage}_over_warm_s"] = max(seconds - stages[stage], 0.0)
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
        reserved = torch.cuda.max_memory_reserved(device)  # includes CUDA-graph pools
    else:
        peak, kind, reserved = _peak_rss_bytes(), "process_peak_rss", None
        notes.append("peak memory is the process-lifetime peak RSS (it includes everything "
                     "this process did before, not only this benchmark)")
    if (quant := info.applied.get("quantize")) is not None:
        notes.append(f"{quant['kind']}: {quant['linears']} linear layers quantized")
    if "few_step" in info.applied:  # weights changed by fdh.use_few_step: not in the recipe
        notes.append(f"few-step weights fused: {info.applied['few_step']}")
    if isinstance(info.applied.get("no_sync"), dict):
        notes.append(f"no_sync: {info.applied['no_sync']['why']}")
    if info.recipe is None:
        notes.append("no fdh.apply() recipe: the recipe recorded is read off the pipeline "
                     f"(techniques applied one by one: {', '.join(info.applied) or 'none'})")
    latency = statistics.median(samples)
    recipe = current_recipe(pipe)
    n = resolved["num_inference_steps"]
    stop = (cutoff_share(callback_on_step_end, n, denoiser_calls(pipe.scheduler, n))
            if resolved["guidance_scale"] > 1 else None)  # without guidance: nothing to stop
    if stop is not None:  # diffusers' CFG cut-off callback, passed on each call
        recipe["guidance_stop"] = stop
        notes.append(f"guidance on the first {guided_steps(n, stop)} of {n} steps: "
                     f"{type(callback_on_step_end).__name__}, passed on each call")
    elif callback_on_step_end is not None:
        notes.append(f"callback_on_step_end={type(callback_on_step_end).__name__} on each call "
                     "(FLOPs counted as without it)")
    flops = count_flops(pipe, resolved["height"], resolved["width"], n,
                        resolved["guidance_scale"], guidance_stop=stop)["per_image"]
    quality = compare_images(image, baseline_image) if baseline_image is not None else None
    return Result(
        model=info.model, weights=info.weights, step=step,
        recipe=recipe,
        device_name=device_name(device),
        height=resolved["height"], width=resolved["width"],
        steps=resolved["num_inference_steps"], guidance=float(resolved["guidance_scale"]),
        seed=seed, prompt=prompt, runs=runs, warmup=warmup, latency_s=latency,
        latency_samples=samples, cold_start_s=cold, peak_memory_bytes=peak,
        peak_memory_kind=kind, peak_reserved_bytes=reserved,
        stages=stages,
        stage_samples=stage_samples, flops_per_image=float(flops),
        tflops_per_s=flops / latency / 1e12 if device.type == "cuda" else None,
        quality=quality, env=env_report(), notes=notes, image=image, vae=info.vae,
        scheduler=type(pipe.scheduler).__name__, tf32=tf32_state(),
        compile_events=compiles, cold_start_split=cold_split, ops=ops)
