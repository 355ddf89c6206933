"""warm_ladder(): every compiled step of a ladder compiled once ahead of time, so the compile
cache holds them all (and, given a file, a portable artifact of them); behind `python -m
fastdiff_helpers warm` and what make demo compiles ahead in parallel processes.

Introduced in 05_cold_start.ipynb.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Iterable

import torch

from ...models.loading import (FastdiffError, call_kwargs, free_memory, get_denoiser,
                              load_pipeline, pipeline_info, resolve_weights)
from ...techniques import apply, current_recipe
from ..planning.autotune import course_tuning, covers, step_blocked
from ...techniques.compile import capture_denoiser_inputs
from ...techniques.step_cache import step_plan
from ...techniques.recipe import RecipeError
from ..planning.ladders import LADDERS
from ..compiletime.cold_start import save_artifacts
from ...measure.compile_events import events_between, snapshot
from ..compiletime.bundle import check_bundle_path
from ..compiletime.watch import TuningWatch
from .ladder import _setup, resolve_ladder

__all__ = ["warm_ladder", "compile_part"]


PARTS = ("all", "denoiser", "vae")


def capture_vae_inputs(pipe, **kwargs) -> tuple[tuple, dict]:
    """The (args, kwargs) the pipeline passes to pipe.vae.decode, from a real short call run
    eagerly (a compiled decode or denoiser neither runs nor compiles)."""
    decode = pipe.vae.decode
    seen: list[tuple[tuple, dict]] = []

    def capture(*args, **kw):
        if not seen:
            seen.append((args, dict(kw)))
        return decode(*args, **kw)

    pipe.vae.decode = capture
    try:
        with torch.compiler.set_stance("force_eager"):
            pipe(**call_kwargs(pipe, **dict(dict(steps=2), **kwargs)))
    finally:
        pipe.vae.decode = decode
    if not seen:
        raise RecipeError(f"{type(pipe).__name__} did not call vae.decode: nothing to capture.")
    return seen[0]


def compile_part(pipe, part: str = "all", **kwargs) -> None:
    """Compile one part of a compiled pipeline by calling it once with exactly the inputs
    the pipeline gives it (shapes, dtype, memory layout, grad mode), so that tuning the
    denoiser and the VAE decode can go in separate commands; a later pipeline call finds
    both compiled (no recompile). "all": one pipeline call. `kwargs`: call_kwargs's.
    Introduced in docs/instructor.md."""
    if part not in PARTS:
        raise RecipeError(f"Unknown part {part!r}. Use one of: {', '.join(PARTS)}.")
    done = pipeline_info(pipe).applied
    if "compile" not in done:
        raise RecipeError("This pipeline is not compiled: apply a recipe with compile first.")
    if part == "all":
        pipe(**call_kwargs(pipe, **kwargs))
        return
    if step_plan(pipe) is not None or "guidance_stop" in done:
        raise RecipeError("A step plan or a guidance stop changes the denoiser's inputs from "
                          "step to step: compile it with part='all' (one pipeline call).")
    if part == "vae" and not done["compile"]["compile_vae"]:
        raise RecipeError("The VAE decode is not compiled in this recipe (compile_vae=False).")
    args, kw = (capture_denoiser_inputs(pipe, **kwargs) if part == "denoiser" else
                capture_vae_inputs(pipe, **kwargs))
    with torch.no_grad():  # as the pipeline's __call__ runs (@torch.no_grad(): dynamo guards it)
        (get_denoiser(pipe) if part == "denoiser" else pipe.vae.decode)(*args, **kw)


def warm_ladder(model: str = "sdxl", weights: str = "auto", ladder: str | None = None,
                steps: int | None = None, height: int | None = None, width: int | None = None,
                device: str | None = None, out: str | Path | None = None,
                steps_filter: Iterable[str] | None = None, part: str = "all",
                bundle: str | Path | None = None) -> list[dict]:
    """Compile every compiled step of a ladder once (a fresh pipeline each, one call each),
    so the compile cache holds them all; with `out`, also write them as one portable artifact
    file (fdh.course.save_artifacts) for other machines of the same GPU kind and
    versions. Returns one row per step: load (with apply), first call, and its compile split.

    `part`: "denoiser" or "vae" compiles only that part, with the exact inputs the pipeline
    gives it (compile_part, above), so each part's max-autotune tuning fits its own
    command; "all" (default) makes one pipeline call. `bundle`: keep the tuning in this bundle as it
    grows (TuningWatch: every 30 s, at the end, when stopped), e.g. fdh.course.bundle_path(model);
    import first what you have (fdh.course.import_tuning).

    What an instructor runs before a workshop (05_cold_start.ipynb).
    Introduced in docs/instructor.md."""

    ladder = resolve_ladder(model, ladder)
    spec, device, wanted, loading = _setup(model, ladder, device, steps_filter, steps, height,
                                           width, out, out_is_file=True)
    if part not in PARTS:
        raise FastdiffError(f"Unknown part {part!r}. Use one of: {', '.join(PARTS)}.")
    if bundle is not None:
        check_bundle_path("bundle", bundle)
    weights = resolve_weights(spec, weights, device)
    rungs = LADDERS[ladder]
    plan = [(n, r, rungs[i - 1][1] if i else None) for i, (n, r) in enumerate(rungs)
            if r.compile and (wanted is None or n in wanted)]
    if not plan:
        raise FastdiffError(f"No compiled step to warm in the {ladder} ladder"
                            f"{' among ' + ', '.join(sorted(wanted)) if wanted else ''}.")
    rows: list[dict] = []
    watch = (TuningWatch(bundle, spec.key, command=f"warm {spec.key} {ladder} part={part}")
             if bundle is not None else nullcontext())
    with watch:
        for name, recipe, previous in plan:
            row = _warm_step(spec, name, recipe, weights, device, loading, part,
                             dict(steps=steps, height=height, width=width), previous)
            if row is not None:
                rows.append(row)
                if bundle is not None:
                    parts = None if part == "all" else (part,)
                    watch.note_step(name, row["first_call_s"], row, "warmed", part=part,
                                    covers=covers(spec.key, weights, row["recipe"], parts))
    if out is not None:
        header = save_artifacts(out, model=spec.key, weights=weights, ladder=ladder,
                                steps=[r["step"] for r in rows])
        print(f"fastdiff: compile artifacts ({header['bytes'] / 2**20:.1f} MiB) in {out}, "
              f"SHA-256 {header['sha256']}. On another machine of the same GPU kind and "
              f"versions: python -m fastdiff_helpers warm --load {out} --sha256 "
              f"{header['sha256']} (the file holds code that runs: pass it only to people who "
              "trust you, and load only files from people you trust)")
    return rows


def _warm_step(spec, name, recipe, weights, device, loading, part, call, previous=None
               ) -> dict | None:
    """One compiled step warmed: load, apply, the part compiled; its row (None: not here,
    or a step that is autotuning alone where it may not tune: it would compile the step
    before it again)."""
    adapted, _ = recipe.for_device(device)
    try:
        adapted.check_device(device)
        reason = step_blocked(previous, recipe, device, spec.key, weights)
        if reason is not None:
            raise RecipeError(reason)
    except RecipeError as exc:  # nothing to warm where the step cannot run
        print(f"fastdiff: not warming {spec.key} {name}: {exc}")
        return None
    started = time.perf_counter()
    pipe = load_pipeline(spec.key, weights=weights, device=device, verbose=False,
                         dtype=adapted.weight_dtype, **loading)
    apply(pipe, adapted, tuning=course_tuning)
    load_s = time.perf_counter() - started
    before, started = snapshot(), time.perf_counter()
    compile_part(pipe, part, **call)
    first = time.perf_counter() - started
    events = events_between(before, snapshot())
    recipe_run = current_recipe(pipe)  # what it compiled, after the autotune rule
    print(f"fastdiff: warmed {spec.key} {name}{'' if part == 'all' else ' (' + part + ')'}: "
          f"load {load_s:.1f} s, first call {first:.1f} s (compile {events['compile_s']:.1f} s, "
          f"{events['frames']} frame(s), {events['graph_cache_hits']} graph-cache hit(s), "
          f"{events['autotunes']} shape(s) autotuned, {events['coordesc_benches']} "
          "coordinate-descent config(s) timed)")
    del pipe
    free_memory()  # dynamo's caches (the artifacts to save are kept apart by torch)
    return {"step": name, "part": part, "load_s": load_s, "first_call_s": first,
            "recipe": recipe_run, **events}
