"""Notebook plumbing: the parameters cell (smoke mode) and GPU-only cells.

Introduced in 00_setup.ipynb."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .pretrained import resolve_weights
from .presets import default_resolution, get_spec


def smoke_mode() -> bool:
    """True when FASTDIFF_SMOKE=1: tiny weights, 2 steps, small images, CPU (CI runs this)."""
    return os.environ.get("FASTDIFF_SMOKE", "").strip() in ("1", "true", "yes")


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

    def bench_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for fdh.benchmark / fdh.generate (steps, height, width...)."""
        return dict(steps=self.steps, height=self.height, width=self.width, runs=self.runs,
                    warmup=self.warmup)

    def ladder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for fdh.run_ladder(model, ...): weights, device and bench_kwargs."""
        return dict(self.bench_kwargs(), weights=self.weights, device=self.device)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def course_settings(model: str = "sdxl", weights: str | None = None, steps: int | None = None,
                    resolution: int | None = None, runs: int | None = None,
                    smoke: bool | None = None) -> CourseSettings:
    """The parameters cell of every notebook. Smoke mode (FASTDIFF_SMOKE=1 or smoke=True):
    tiny weights on the CPU, 2 steps, 64x64, 2 timed runs. Otherwise the model's native
    resolution and 30 steps, weights="auto" (pretrained, else random on a GPU, else tiny),
    5 timed runs after 2 warm-ups. "auto" is resolved here and the choice printed; the
    tiny model gets its tiny resolution."""
    spec = get_spec(model)
    smoke = smoke_mode() if smoke is None else smoke
    device = "cpu" if smoke or not torch.cuda.is_available() else "cuda"
    weights = weights or ("tiny" if smoke else "auto")
    weights = resolve_weights(spec, weights, device)  # "auto" decided once, for every cell
    size = resolution or default_resolution(spec, weights)
    return CourseSettings(
        model=spec.key, weights=weights, device=device,
        steps=steps or (2 if smoke else spec.steps), height=size, width=size,
        runs=runs or (2 if smoke else 5), warmup=1 if smoke else 2, smoke=smoke)


def needs_gpu(why: str) -> bool:
    """Guard for a GPU-only cell: True on a CUDA machine; on a CPU prints why the cell is
    skipped and returns False. Cells using it are also tagged "gpu" in the notebook."""
    if torch.cuda.is_available():
        return True
    print(f"Skipped on this CPU machine (needs a CUDA GPU): {why}")
    return False
