"""Fewer steps: another diffusers scheduler in place of the pipeline's own.

Introduced in 12_fewer_denoiser_calls.ipynb. The same swap as load_pipeline(scheduler=...), on a
pipeline already loaded: SchedulerClass.from_config(pipe.scheduler.config), the way the
diffusers docs swap schedulers (the new class keeps the training betas and timestep settings it
shares, and its own defaults for the rest)."""

from __future__ import annotations

from ..errors import FastdiffError
from ..models.presets import SCHEDULERS


def set_scheduler(pipe, name: str):
    """Swap the scheduler: "dpm-solver" (DPM-Solver++ multistep), "unipc" or "euler" (see
    fdh.models.presets.SCHEDULERS). Every Result records the class that ran
    (Result.scheduler). Introduced in 12_fewer_denoiser_calls.ipynb."""
    if name not in SCHEDULERS:
        raise FastdiffError(f"Unknown scheduler {name!r}. Use one of: {', '.join(SCHEDULERS)}.")
    import diffusers

    pipe.scheduler = getattr(diffusers, SCHEDULERS[name]).from_config(pipe.scheduler.config)
    return pipe
