"""Notebook plumbing: the parameters cell (smoke mode) and GPU-only cells.

Introduced in 00_setup.ipynb."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import FastdiffError
from .. import checks
from ..models.noise import quiet_known_noise
from ..models.presets import get_spec
from .planning.gpus import gpu_profile
from ..models.hooks import auto_weights
from ..models.pretrained import check_weights
from .planning.autotune import autotune_enabled, course_tuning, set_autotune
from .compiletime.bundle_io import import_matching
from .planning.tuning_state import STATE
from .reference import REFERENCE_ROOT
from ..techniques.recipe import BASELINE, Recipe
from .planning.sizing import card_fit, fitting_sizes, rung_verdict
from .hosted import card_problem
from .weights import carried_rule, course_weights
from .planning.recorder import start_recording
from .written_for import written_for_line


# The tiny model's denoising steps outside smoke mode (the CPU story: the notebooks, the
# playground and `make demo` on a machine without a GPU): its images are toys and its timings
# compare per-step costs, which 10 steps show as well as 30 in a third of the time, and which
# keeps a first `make demo` on a 2-core CPU within minutes.
TINY_STEPS = 10


def smoke_mode() -> bool:
    """True when FASTDIFF_SMOKE=1 (checks.env_switch's values): tiny weights, 2 steps, small
    images, CPU (CI runs this). Introduced in 00_setup.ipynb."""
    return checks.env_switch("FASTDIFF_SMOKE", "smoke mode")


@dataclass(frozen=True)
class CourseSettings:
    """What a notebook's parameters cell sets: model, weights, device, steps, size, runs."""

    model: str
    weights: str
    device: str
    steps: int
    height: int
    width: int
    runs: int
    warmup: int
    smoke: bool
    # the most timed runs fdh.benchmark may add to settle a median (None: its default, 4 x
    # runs); smoke mode proves the code runs, so it times `runs` calls and no more
    max_runs: int | None = None
    # whether compiles may tune on a GPU (course/planning/autotune.py): the switch as it stands;
    # left out of the repr the parameters cell prints (autotuning waits for optional lesson 13)
    autotune: bool = field(default=False, repr=False)
    # on a GPU: the largest batch that fits at this size (course/planning/sizing.py), and the card's
    # profile key ("t4", "h100", "other"; None without a GPU)
    max_batch: int = 1
    gpu: str | None = None
    # the baseline's dtype: "fp32", or on a card where the model's fp32 does not fit, the
    # card's half precision (course/planning/sizing.py card_fit); settings.baseline is its recipe
    baseline_dtype: str = "fp32"

    @property
    def tuning(self) -> Callable:
        """The course's autotune decision, to pass to fdh.apply and fdh.compile_pipeline
        (`tuning=settings.tuning`): on a GPU a compile that would tune (max-autotune, the
        blog's coordinate descent) runs its default-mode equivalent, said in one line, unless
        autotuning is switched on (`autotune=True` here) or an imported tuning bundle covers it
        (course/planning/autotune.py course_tuning). Introduced in 04_torch_compile.ipynb."""
        return course_tuning

    @property
    def baseline(self) -> Recipe:
        """The baseline recipe a notebook measures the others against: the course's fp32 one
        (fdh.Recipe()), or, on a card where fp32 does not fit (SDXL on a T4), the same recipe in
        the card's half precision, as course_settings said. Introduced in 00_setup.ipynb."""
        return (BASELINE if self.baseline_dtype == "fp32"
                else replace(BASELINE, dtype=self.baseline_dtype))

    def skip(self, recipe: Recipe) -> str | None:
        """Why this card skips `recipe`, said in one line before anything loads, or None where
        it runs (always off a GPU): the hardware it names (fp8 below sm89), and, for full-size
        weights, its estimated peak at this size; decided by course/planning/sizing.py rung_verdict,
        as the plan decides. Introduced in 16_where_the_time_goes.ipynb."""
        if self.device != "cuda":
            return None
        status, _, why = rung_verdict(gpu_profile(), self.model, recipe, size=self.height,
                                      memory=self.weights != "tiny")
        if status != "skipped":
            return None
        print(f"fastdiff: skipped on this card: {why[0]}")
        return why[0]

    def bench_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for fdh.benchmark (steps, height, width, runs, warmup, max_runs)."""
        return dict(steps=self.steps, height=self.height, width=self.width, runs=self.runs,
                    warmup=self.warmup, max_runs=self.max_runs)

    def ladder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for fdh.course.run_ladder(model, ...): weights, device and
        bench_kwargs."""
        return dict(self.bench_kwargs(), weights=self.weights, device=self.device)

    def sizes_that_fit(self, sizes: Sequence[int]) -> list[int]:
        """The `sizes` (square, in pixels) whose estimated peak in half precision fits this
        card (course/planning/sizing.py; every size off a GPU), saying which were left out and why.
        Introduced in 05_cold_start.ipynb."""
        if self.gpu is None or self.weights == "tiny":
            return list(sizes)
        return fitting_sizes(gpu_profile(), self.model, sizes)


def course_hooks() -> None:
    """Put the course's two hooks in this process (models/hooks.py): the clock's recorder,
    where FASTDIFF_CLOCK_LOG asks for it, and weights="auto" reading the choices a parameters
    cell carried between notebooks. Course settings and the command line call it."""
    start_recording()
    auto_weights(carried_rule)


def course_settings(model: str = "sdxl", weights: str | None = None, steps: int | None = None,
                    resolution: int | None = None, runs: int | None = None,
                    smoke: bool | None = None, autotune: bool | None = None,
                    tuning: str | Path | None = None) -> CourseSettings:
    """The parameters cell of every notebook. Smoke mode (FASTDIFF_SMOKE=1 or smoke=True):
    tiny weights on the CPU, 2 steps, 64x64, 2 timed runs. Otherwise the model's native
    resolution and 30 steps, weights="auto" (fdh.course.choose_weights: on a GPU never random unasked),
    5 timed runs after 2 warm-ups. On a GPU the size, timed runs and warm-ups are sized for
    the card (course/planning/sizing.py card_fit: the native size where it fits in half precision,
    fewer timed runs where an image takes long) and said in one line; what you pass is kept.
    "auto" is resolved here and the choice printed; the
    tiny model gets its tiny resolution and TINY_STEPS (10) steps: the CPU story, the same in
    the notebooks, the playground and `make demo`.

    Autotuning (max-autotune's search and coordinate descent, tens of minutes a recipe on a new
    GPU) runs only when asked for: `autotune=True` switches it on for this process
    (fdh.course.set_autotune; None leaves the switch as it is: off, or FASTDIFF_AUTOTUNE=1). On a GPU
    the matching tuning bundles are imported here, once per process: those committed under
    results/ (shipped in the package) and those under `tuning` (or $FASTDIFF_TUNING_DIR), a
    folder an instructor names, laid out as results/ is (<gpu>/tuning/<torch>/<model>.json.gz); a compile
    they cover reads its tuning with autotuning off.
    Introduced in 00_setup.ipynb."""
    spec = get_spec(model)
    checks.whole("steps", steps, 1, none=True)
    checks.image_size("resolution", resolution, spec.size_multiple)
    checks.whole("runs", runs, 1, none=True)
    if weights is not None:
        check_weights(weights)
    if smoke not in (None, True, False):
        raise FastdiffError(f"{checks.arg('smoke', smoke)} cannot work: give True, False or "
                            "None (None reads FASTDIFF_SMOKE).")
    if autotune not in (None, True, False):
        raise FastdiffError(f"{checks.arg('autotune', autotune)} cannot work: give True, False "
                            "or None (None leaves the switch as it is).")
    tuning = tuning if tuning is not None else os.environ.get(TUNING_ENV) or None
    if tuning is not None:
        tuning = checks.existing("tuning", tuning, "a folder of tuning bundles laid out as "
                                 "results/ is (<gpu>/tuning/<torch>/<model>.json.gz)", folder=True)
    quiet_known_noise()  # the parameters cell runs first in every notebook
    course_hooks()
    print(written_for_line())  # copied code takes these versions' spellings
    smoke = smoke_mode() if smoke is None else smoke
    device = "cpu" if smoke or not torch.cuda.is_available() else "cuda"
    if device == "cuda":  # a card the course cannot use is refused before anything loads
        problem = card_problem(torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
                               torch.cuda.get_arch_list())
        if problem:
            raise FastdiffError(problem)
    weights = weights or ("tiny" if smoke else "auto")
    weights = course_weights(spec, weights, device)  # decided once, carried on a GPU
    if autotune is not None:
        set_autotune(autotune)
    if device == "cuda":
        import_course_tuning(tuning)
    size = resolution or spec.resolution_for(weights)
    steps = steps or (2 if smoke else TINY_STEPS if weights == "tiny" else spec.steps)
    warmup, max_batch, profile, baseline = (1 if smoke else 2), 1, None, "fp32"
    if device == "cuda" and weights != "tiny":  # sized for this card, said in one line
        profile = gpu_profile()
        fit = card_fit(profile, spec.key, resolution)
        print(fit.line(profile, spec.key, steps))
        size, warmup, max_batch = resolution or fit.size or size, fit.warmup, fit.max_batch
        runs = runs or fit.runs
        baseline = "fp32" if fit.fp32_fits else fit.half
    return CourseSettings(
        model=spec.key, weights=weights, device=device, steps=steps, height=size, width=size,
        runs=runs or (2 if smoke else 5), warmup=warmup, smoke=smoke,
        max_runs=(runs or 2) if smoke else None, autotune=autotune_enabled(),
        max_batch=max_batch, gpu=profile.key if profile else None, baseline_dtype=baseline)


TUNING_ENV = "FASTDIFF_TUNING_DIR"


def import_course_tuning(tuning: str | Path | None = None) -> list[dict]:
    """Import, once per process and folder, the tuning bundles of this GPU and torch under
    the committed results/ (shipped in the package) and under `tuning`; says in one line what
    they cover, and nothing where none matches. Introduced in 00_setup.ipynb."""
    done: list[dict] = []
    roots = [root for root in [REFERENCE_ROOT] + ([Path(tuning)] if tuning is not None else [])
             if str(root.resolve()) not in STATE.roots and root.is_dir()]
    if not roots:
        return done  # said when this process first looked
    for root in roots:
        STATE.roots.add(str(root.resolve()))
        done += import_matching(root, verbose=False)
    if done:
        print(f"fastdiff: imported {len(done)} tuning bundle(s) of this GPU and torch "
              f"({sum(d.get('covers', 0) for d in done)} compiled part(s) covered): "
              + ", ".join(d["path"] for d in done))
    # Nothing is said about autotuning otherwise: the core path never tunes, and a compile that
    # would tune says so itself (course/planning/autotune.py; 13_autotuning teaches the switch).
    return done


def needs_gpu(why: str) -> bool:
    """Guard for a GPU-only cell: True on a CUDA machine; on a CPU prints why the cell is
    skipped and returns False. Cells using it are also tagged "gpu" in the notebook.
    Introduced in 00_setup.ipynb."""
    if torch.cuda.is_available():
        return True
    print(f"Skipped on this CPU machine (needs a CUDA GPU): {why}")
    return False
