"""run_ladder(): every step of a ladder (the blog's fdh.course.LADDER, the course's
fdh.course.COURSE_LADDER or its fdh.course.FLUX_LADDER) on a fresh pipeline, with failures isolated.
Compiling ahead: warm.py.

Introduced in 08_int8_quantization.ipynb (its last two steps) and 17_all_models.ipynb (every
model), and behind `python -m fastdiff_helpers ladder`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterable

from ... import checks
from ...models.loading import (FastdiffError, default_device, free_memory,
                              get_denoiser, load_pipeline, resolve_weights)
from ...models.presets import DEFAULT_PROMPT, SCHEDULERS, get_spec
from ..planning.published import BLOG_LOADING
from ..planning.published import published_ladder
from ...techniques import apply
from ..planning.autotune import course_tuning, step_blocked
from ...techniques.quantization import select_filter
from ...techniques.recipe import RecipeError
from ..planning.ladders import LADDERS
from ...measure.bench import benchmark
from ..compiletime.cold_start import check_artifacts_path
from ...measure.env import device_name, env_report
from ...measure.quality import compare_images
from ...results.charts import Reference, ladder_chart, memory_chart
from ...results.store import Result
from ..reference import RESULTS_FOLDER, chart_file, save_figure, save_result
from ...results.tables import format_table
from ..planning.writes import output_folder

__all__ = ["run_ladder", "measure_step", "resolve_ladder"]


class InjectedFailure(RuntimeError):
    """Raised by run_ladder(fail_step=...): a testing aid that proves failure isolation."""


def _check_names(names: Iterable[str] | None, what: str, ladder: str) -> set[str] | None:
    if names is None:
        return None
    names = {names} if isinstance(names, str) else set(names)
    known = [n for n, _ in LADDERS[ladder]]
    unknown = sorted(names - set(known), key=str)
    if unknown or not names:
        said = f"Unknown ladder step(s) {unknown}" if unknown else "No step"
        raise FastdiffError(f"{said} in {checks.arg(what)}. The {ladder} ladder's steps are: "
                            f"{', '.join(repr(n) for n in known)}.")
    return names


def resolve_ladder(model: Any, ladder: str | None) -> str:
    """`ladder`, or the model's own when None ("blog" for the four models the blog ran, "flux"
    for Flux), refused where it was not written for the model."""
    spec = get_spec(model)
    ladder = spec.ladders[0] if ladder is None else ladder
    if ladder not in LADDERS:
        raise FastdiffError(f"Unknown ladder {ladder!r}. Use one of: {', '.join(LADDERS)}.")
    if ladder not in spec.ladders:
        why = {"blog": "the blog's ladder is what diffusion-fast ran on its four models, and it "
                       "ran no Flux",
               "course": "the course's ladder starts from fp32 with classic attention, which "
                         "Flux lacks (techniques/flux.py)",
               "flux": "the Flux ladder's steps and filter are written for Flux"}[ladder]
        raise FastdiffError(f"ladder={ladder!r} is not written for {spec.key}: {why}. Use "
                            f"ladder={spec.ladders[0]!r} (--ladder {spec.ladders[0]}).")
    return ladder


def _setup(model: str, ladder: str | None, device: str | None,
           steps_filter: Iterable[str] | None, steps: int | None = None,
           height: int | None = None, width: int | None = None,
           out: str | Path | None = None, out_is_file: bool = False
           ) -> tuple[Any, str, set[str] | None, dict]:
    """What run_ladder and warm_ladder share before any work: every argument checked (the
    call's sizes and counts too, so a bad one fails once, here, not in every step), the
    model's spec, the device, the steps asked for and the loading options of the ladder (the
    blog's VAE and scheduler for "blog"). The ladder itself: resolve_ladder, first."""
    spec = get_spec(model)
    ladder = resolve_ladder(spec, ladder)
    wanted = _check_names(steps_filter, "steps_filter", ladder)
    checks.call_size(steps, height, width, spec.size_multiple)
    if out is not None:
        if out_is_file:
            check_artifacts_path("out", out)
        else:  # its charts, drawn at the end, are checked now too
            folder = output_folder("out", out, RESULTS_FOLDER)
            for chart in ("ladder.png", "memory.png"):
                chart_file("out", folder / chart)
    device = checks.device(device) if device is not None else default_device()
    loading = BLOG_LOADING[spec.key] if ladder == "blog" else {}
    return spec, device, wanted, loading


def _selects_any(pipe, recipe) -> bool:
    chosen = select_filter(recipe.quantize, recipe.quant_filter)
    return any(chosen(m, name) for part in (get_denoiser(pipe), pipe.vae)
               for name, m in part.named_modules())


def measure_step(spec, name: str, recipe, weights: str, device: str, loading: dict,
                 baseline=None, *, steps: int | None = None, height: int | None = None,
                 width: int | None = None, runs: int = 5, warmup: int = 2, seed: int = 0,
                 prompt: str | None = None, progress: bool = True, fail: bool = False,
                 profile: bool = False, max_runs: int | None = None,
                 previous=None) -> Result:
    """One ladder step on a fresh pipeline: load (with the ladder's `loading` options), the
    recipe adapted to the device (its notes go to Result.notes), apply, benchmark with quality
    against `baseline` (a PIL image, or None). A failure (OOM, compile error, RecipeError...)
    comes back as a Result with error="Type: message", so one step never loses the others.
    The pipeline is freed before returning. `fail=True` forces a failure (a testing aid).
    `previous`: the ladder's step before; a step that only adds tuning to it (the course's
    "+ autotune") is not run where it may not tune (course/planning/autotune.py, blocked): it would
    run as the step before. Shared by run_ladder and the reference run (tools/reference/run.py)."""
    adapted, notes = recipe.for_device(device)
    size = spec.resolution_for(weights)
    pipe = None
    started = time.perf_counter()
    try:
        adapted.check_device(device)  # hardware this machine lacks (fp8): refused before loading
        reason = step_blocked(previous, recipe, device, spec.key, weights)
        if reason is not None:
            raise RecipeError(reason)
        pipe = load_pipeline(spec, weights=weights, device=device, verbose=False,
                             dtype=adapted.weight_dtype, **loading)
        if fail:
            raise InjectedFailure(f"fail_step={name!r} asked this step to fail")
        if weights == "tiny" and adapted.quantize and not _selects_any(pipe, adapted):
            # "fastdiff" keeps only linears of the real models' size; a tiny model has
            # none, and an int8 step that quantized nothing would be reported as if it had
            notes.append(f"tiny weights: quant_filter={adapted.quant_filter!r} selects no "
                         "linear here, so this step quantizes with quant_filter='all'")
            adapted = dataclasses.replace(adapted, quant_filter="all")
        apply(pipe, adapted, tuning=course_tuning)
        load_s = time.perf_counter() - started
        result = benchmark(pipe, prompt=prompt or DEFAULT_PROMPT, steps=steps, height=height,
                           width=width, runs=runs, warmup=warmup, seed=seed, progress=progress,
                           step=name, baseline=baseline, profile=profile, max_runs=max_runs)
        result.notes = notes + result.notes
        result.load_s = load_s
    except Exception as exc:  # one step's failure must not lose the steps already measured
        result = Result(
            model=spec.key, weights=weights, step=name, recipe=adapted.to_dict(),
            device_name=device_name(device),
            height=height or size, width=width or size, steps=steps or spec.steps,
            guidance=spec.guidance,
            seed=seed, prompt=prompt or DEFAULT_PROMPT, runs=runs, warmup=warmup,
            env=env_report(), error=f"{type(exc).__name__}: {exc}".strip(), notes=notes,
            vae=loading.get("vae", "pipeline"),
            scheduler=SCHEDULERS.get(loading.get("scheduler", ""), spec.scheduler.class_name))
    finally:
        del pipe
        free_memory()
    result.wall_s = time.perf_counter() - started
    return result


def run_ladder(model: str = "sdxl", weights: str = "auto", steps: int | None = None,
               height: int | None = None, width: int | None = None, runs: int = 5,
               warmup: int = 2, out: str | Path | None = None, device: str | None = None,
               steps_filter: Iterable[str] | None = None, progress: bool = True,
               fail_step: str | None = None, prompt: str | None = None,
               seed: int = 0, ladder: str | None = None, profile: bool = False,
               max_runs: int | None = None) -> list[Result]:
    """Benchmark each step of a ladder (fp32 -> ... -> int8 dynamic) on a FRESH pipeline.

    ladder: "blog" (fdh.course.LADDER, the blog's recipe on today's stack, loaded with the blog's
    VAE and scheduler, fdh.course.BLOG_LOADING; 01_baseline.ipynb lists what differs from
    diffusion-fast) or "course" (fdh.course.COURSE_LADDER, the course's own: true fp32 baseline,
    TF32 and sync removal as steps, the pipeline's own VAE and scheduler), for the four models the
    blog ran; "flux" (fdh.course.LADDERS["flux"], the course's Flux ladder, 19_flux.ipynb) for Flux.
    None: the model's own (the first of these that it takes).
    Each step: load_pipeline(model, weights, device) in the step's weight dtype
    (Recipe.weight_dtype: fp16 files for a half-precision step, fp32 for fp32 and TF32), the
    step's recipe adapted
    to the device (Recipe.for_device; its notes go to Result.notes), fdh.apply, benchmark,
    and quality against the first step's image. A step that fails is recorded as a Result
    with error="Type: message" and the ladder goes on. Between steps the pipeline is deleted
    and torch._dynamo reset (other compiled code in this process recompiles on its next
    call). `steps_filter`: the step names to run (default all). `fail_step`: a step name
    forced to fail, a testing aid for that isolation. `profile`: each step's top ops in one
    more, untimed call (Result.ops; what `make demo` explains the steps with).

    With `out`: each Result is appended to out/results.jsonl as soon as it is measured (a run
    killed half-way leaves a loadable file), its image goes to out/images/<idx>_<slug>.png,
    and out/ladder.png (with the blog's A100 timings beside ours, for non-tiny weights) and
    out/memory.png are drawn at the end. Prints a table (format_table). Introduced in
    08_int8_quantization.ipynb (its last two steps); 17_all_models.ipynb runs every model."""

    ladder = resolve_ladder(model, ladder)
    spec, device, wanted, loading = _setup(model, ladder, device, steps_filter, steps, height,
                                           width, out)
    checks.whole("runs", runs, 1)
    checks.whole("warmup", warmup, 0)
    if (checks.whole("max_runs", max_runs, 1, none=True) or runs) < runs:
        raise FastdiffError(f"{checks.arg('max_runs', max_runs)} is below "
                            f"{checks.arg('runs', runs)}: give max_runs >= runs.")
    checks.whole("seed", seed, 0)
    if prompt is not None:
        checks.text("prompt", prompt)
    if fail_step is not None:
        _check_names([fail_step], "fail_step", ladder)
    weights = resolve_weights(spec, weights, device)
    out = Path(out) if out is not None else None
    if out is not None and (out / "results.jsonl").exists():
        print(f"fastdiff: appending to the existing {out / 'results.jsonl'}")
    plan = [(i, name, recipe) for i, (name, recipe) in enumerate(LADDERS[ladder])
            if wanted is None or name in wanted]
    results: list[Result] = []
    shown: set[str] = set()  # notes already printed (each once)
    baseline_image = None
    for n, (idx, name, recipe) in enumerate(plan, start=1):
        print(f"[{n}/{len(plan)}] {spec.key} {name}")
        result = measure_step(spec, name, recipe, weights, device, loading, baseline_image,
                              steps=steps, height=height, width=width, runs=runs,
                              warmup=warmup, seed=seed, prompt=prompt, progress=progress,
                              fail=name == fail_step, profile=profile, max_runs=max_runs,
                              previous=LADDERS[ladder][idx - 1][1] if idx else None)
        if result.error is None and baseline_image is None:
            baseline_image = result.image  # the first successful step is the baseline
            result.quality = compare_images(result.image, baseline_image)
            if idx != 0:
                result.notes.append(f"baseline for quality: {name} (the first step that ran)")
        if out is not None:
            save_result(result, out, idx)
        print("   " + result.summary())
        for note in result.notes:  # what was adapted or learnt on the way, on screen too
            if note not in shown:
                print("     note: " + note)
                shown.add(note)
        results.append(result)

    print(format_table(results))
    if out is not None:
        reference, published = None, published_ladder(spec.key, ladder)
        if weights != "tiny" and published is not None:
            reference = Reference("Published", *published)
        save_figure(ladder_chart(results, reference=reference), out / "ladder.png")
        save_figure(memory_chart(results), out / "memory.png")
        print(f"fastdiff: results in {out / 'results.jsonl'}, images in {out / 'images'}, "
              f"charts {out / 'ladder.png'} and {out / 'memory.png'}")
    return results
