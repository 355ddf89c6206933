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
    13_fewer_denoiser_calls.ipynb."""
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


def latency_text(result) -> str:
    """'1.23 s +-4%': a Result's median latency with how far the median may be off
    (Result.latency_uncertainty), for an image title or a line; '1.23 s (one run)' without 2+
    samples. Introduced in 09_fused_qkv.ipynb."""
    u = result.latency_uncertainty
    said = f"{seconds_text(result.latency_s)} s"
    return f"{said} +-{u:.0%}" if u is not None else f"{said} (one run)"


def ratio_range(a, b) -> tuple[float, float | None, float | None]:
    """(ratio, low, high): a's median latency over b's (two Results), and the range their
    medians' intervals allow (a's low end over b's high end, a's high over b's low;
    Result.latency_interval_s): both medians lie in their intervals with about 0.95 x 0.95 =
    90 % together, 25 % for smoke mode's 2 runs each. low and high are None where a result
    has fewer than 2 samples."""
    ratio = a.latency_s / b.latency_s
    ia, ib = a.latency_interval_s, b.latency_interval_s
    if ia is None or ib is None:
        return ratio, None, None
    return ratio, ia[0] / ib[1], ia[1] / ib[0]


def ratio_text(a, b, unit: str = "x") -> str:
    """'1.52x (1.41-1.63x)': a's median latency over b's with the range their timing
    uncertainty allows (ratio_range), so a ratio is never quoted bare. For a speed-up give
    (before, after); for a share of a time, (part, whole) and unit="". Introduced in
    09_fused_qkv.ipynb."""
    ratio, low, high = ratio_range(a, b)
    if low is None:
        return f"{ratio:.2f}{unit} (one run: no range)"
    return f"{ratio:.2f}{unit} ({low:.2f}-{high:.2f}{unit})"
