"""How the course writes its numbers: seconds, memory, PSNR. One place, so a table, a chart,
the playground and a summary line never disagree. Imports nothing of the package."""

from __future__ import annotations

import math

GIB = 2**30


def seconds_text(x: float | None) -> str:
    """3 significant figures, the unit left to the caller ('-' for nothing measured)."""
    if x is None:
        return "-"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def uncertainty_text(result) -> str:
    """'+-4%': how far a Result's median may be off (Result.latency_uncertainty), '-' without
    two runs."""
    u = getattr(result, "latency_uncertainty", None)
    return "-" if u is None else f"+-{u:.0%}"


def timing_text(result) -> str:
    """'0.123 s +-4% (median of 5)': a Result's median with how far it may be off, and the
    coverage of that interval where it is below 90 % (2 runs: 50 %); one run says so.
    Introduced in 05_cold_start.ipynb."""
    n = len(getattr(result, "latency_samples", None) or [])
    u = uncertainty_text(result)
    if u == "-":
        return f"{seconds_text(result.latency_s)} s (one run: no +-)"
    coverage = result.latency_interval_s[2]
    sure = "" if coverage >= 0.9 else f", an interval of {coverage:.0%} only"
    return f"{seconds_text(result.latency_s)} s {u} (median of {n}{sure})"


def speedup_text(before, after) -> str:
    """How many times faster `after` ran than `before` (two Results), with the range the two
    medians' intervals allow (Result.latency_interval_s): '2.31x (2.05-2.60x)'; a side with
    one run gives no range. Introduced in 04_torch_compile.ipynb."""
    ratio = f"{before.latency_s / after.latency_s:.2f}x"
    a, b = before.latency_interval_s, after.latency_interval_s
    if a is None or b is None:
        return ratio + " (one run on a side: no range)"
    return f"{ratio} ({a[0] / b[1]:.2f}-{a[1] / b[0]:.2f}x, from the medians' intervals)"


def memory_text(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / 2**20:.0f} MiB"


def psnr_text(quality: dict | None) -> str:
    """'-' without a comparison, 'NaN image', 'identical' (infinite PSNR), else 'NN.N dB'."""
    psnr = (quality or {}).get("psnr")
    if psnr is None:
        return "-"
    if math.isnan(psnr):
        return "NaN image"
    return "identical" if math.isinf(psnr) else f"{psnr:.1f} dB"


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _scheduler(name: str | None) -> str:
    return f", {name.removesuffix('Scheduler')}" if name else ""  # older records: none


def denoising_text(results) -> str:
    """'30 steps, EulerDiscrete' when every result ran the same steps and scheduler, else ''
    (then each result is labelled with denoising_label). Introduced in
    09_fewer_denoiser_calls.ipynb."""
    runs = {(r.steps, r.scheduler) for r in results}
    if len(runs) != 1:
        return ""
    steps, scheduler = next(iter(runs))
    return f"{_steps(steps)}{_scheduler(scheduler)}"


def denoising_label(result, results) -> str:
    """' (20 steps, UniPCMultistep)' for a result among others that ran other steps or another
    scheduler, else '': how a table or chart tells the runs of a scheduler swap apart."""
    if denoising_text(results):
        return ""
    return f" ({_steps(result.steps)}{_scheduler(result.scheduler)})"
