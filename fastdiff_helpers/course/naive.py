"""naive_time: the classic timing mistake, which 01_baseline.ipynb shows beside fdh.benchmark.
The course's, not a tool to take home: it measures the wrong thing on purpose."""

from __future__ import annotations

import statistics
import time

from .. import checks
from ..models.loading import call_kwargs
from ..models.presets import DEFAULT_PROMPT

__all__ = ["naive_time"]


def naive_time(pipe, prompt: str = DEFAULT_PROMPT, steps: int | None = None,
               height: int | None = None, width: int | None = None,
               guidance: float | None = None, seed: int = 0, runs: int = 3,
               output_type: str = "latent") -> float:
    """WRONG ON PURPOSE: the classic timing mistake, kept only to show it in 01_baseline.ipynb.

    Times `pipe(...)` with time.perf_counter() and NO synchronisation and no warm-up, and
    returns the median of `runs` calls. On a GPU the call returns once its kernels are queued,
    so this measures launch overhead plus whatever the queue forced to wait; with
    output_type="latent" nothing copies the image to the host, which hides the most work.
    The first call also includes any compilation (one of `runs`: the median hides it unless
    more calls compile). Compare it with benchmark(pipe).latency_s or time_call(); never use it
    for a real measurement.
    Introduced in 01_baseline.ipynb."""
    checks.whole("runs", runs, 1)
    samples = []
    for _ in range(runs):
        kwargs = call_kwargs(pipe, prompt, steps, height, width, guidance, seed)
        kwargs["output_type"] = output_type
        start = time.perf_counter()
        pipe(**kwargs)  # no synchronize(): that is the mistake being demonstrated
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
