"""What `make demo` says around its ladder: what runs and what its numbers can tell, the
published GPU figures beside the measured ones, why a step is slower here, and what to do next.

Introduced by `make demo` (python -m fastdiff_helpers ladder --explain)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .presets import BLOG_A100_SECONDS, BLOG_A100_WHERE, get_spec
from .record import Result
from .text import seconds_text


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def before(model: str, weights: str, device: str, ladder: str) -> str:
    spec = get_spec(model)
    lines = [f"fastdiff demo: the {ladder} ladder on {spec.name}, {weights} weights, on {device}."]
    if device == "cpu":
        lines += [
            "  This machine has no CUDA GPU, so the demo runs the tiny model on the CPU: the same",
            "  classes and code paths as the real model, far smaller. Its timings show that every",
            "  step runs and what it costs here; they say nothing about GPU speed-ups, which come",
            "  from tensor cores, fused kernels and CUDA graphs a CPU does not have. The published",
            "  GPU figures are printed beside the table at the end.",
            "  Compiled steps compile first (minutes on a CPU; the cache makes a second run faster)."]
    elif weights == "random":
        lines.append("  Full-size architecture with random weights: real speed and memory, "
                     "meaningless images.")
    return "\n".join(lines)


def _why_slower(step: str, device: str) -> str:
    if device != "cpu":
        return "look at its notes and flags; re-run if the timing is unsteady"
    flags = cpu_flags()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if step == "bf16":
        return (f"this CPU has native bf16 matmul ({', '.join(native)}), but the tiny model's "
                "matmuls are too small for it to outweigh the casts around them" if native else
                "this CPU has no native bf16 matmul (no avx512_bf16 or amx_bf16 in "
                "/proc/cpuinfo): bf16 is converted to fp32 and back around every matmul")
    if "compile" in step or "fused" in step or "int8" in step:
        return ("on a CPU inductor emits C++ loops, not tensor-core kernels, and the tiny model's "
                "work per call is too small to win back the extra quantize/convert steps")
    return "the tiny model's attention and matmuls are too small for this change to show"


def after(results: Sequence[Result], device: str, out: str | None) -> str:
    """The measured ladder beside the published A100 one, a line per slower step, next steps."""
    ok = [r for r in results if r.ok and r.latency_s]
    lines = []
    if ok and ok[0].model in BLOG_A100_SECONDS:
        blog = BLOG_A100_SECONDS[ok[0].model]
        base = ok[0].latency_s
        lines.append(f"\n{'step':16} {'here (s)':>9} {'vs first':>9}   {'blog A100 (s)':>13} "
                     f"{'vs fp32':>8}")
        for r in ok:
            ref = blog.get(r.step)
            ref_text = f"{ref:13.3f} {blog['fp32'] / ref:7.2f}x" if ref else f"{'-':>13} {'-':>8}"
            lines.append(f"{r.step:16} {seconds_text(r.latency_s):>9} {base / r.latency_s:8.2f}x"
                         f"   {ref_text}")
        lines.append(f"Published: {BLOG_A100_WHERE[ok[0].model]}.")
    for prev, r in zip(ok, ok[1:]):
        if r.latency_s > prev.latency_s:
            lines.append(f"{r.step} is slower than {prev.step} here: {_why_slower(r.step, device)}.")
    for r in ok:
        for flag in r.flags:
            lines.append(f"{r.step}: {flag}.")
    if out:
        lines.append(f"\nThis run is in {out} (results.jsonl, images/, ladder.png); "
                     "`make demo` writes each run to a new folder.")
    lines.append("Next: `make lab`, then open notebooks/00_setup.ipynb "
                 "(README: how to reach JupyterLab on a remote machine).")
    return "\n".join(lines)
