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

from ...models.loading import FastdiffError, free_memory, load_pipeline, resolve_weights
from ...techniques import apply, current_recipe
from ..planning.autotune import course_tuning, covers, step_blocked
from ...techniques.compile import PARTS, compile_part
from ...techniques.recipe import RecipeError
from ..planning.ladders import LADDERS
from ..compiletime.cold_start import save_artifacts
from ...measure.compile_events import events_between, snapshot
from ..compiletime.bundle import check_bundle_path
from ..compiletime.watch import TuningWatch
from .ladder import _setup, resolve_ladder

__all__ = ["warm_ladder"]


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
    gives it (techniques/compile.py compile_part), so each part's max-autotune tuning fits its own
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
