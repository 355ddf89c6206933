"""How the course writes its numbers: memory, PSNR, the denoising a run used. One place, so a
table, a chart, the playground and a summary line never disagree; seconds and their +- are the
Result's own (measure/record.py: seconds_text, Result.timing_text, Result.speedup_over).
Imports nothing of the package."""

from __future__ import annotations

import math

GIB = 2**30


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
