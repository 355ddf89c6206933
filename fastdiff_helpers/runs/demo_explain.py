"""What `make demo` says after its ladder: each step against the one before, from what was
measured (its stages, its profile, this CPU's matmul rates), and the table beside the blog's
published A100 figures. Introduced by `make demo` (runs/demo.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..planning.published import BLOG_A100_SECONDS, BLOG_A100_WHERE
from ..measure.record import Result
from ..results.text import seconds_text

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _close(a: Result, b: Result) -> bool:
    """The two medians are within each other's uncertainty."""
    u = max(a.latency_uncertainty or 0.0, b.latency_uncertainty or 0.0)
    return abs(a.latency_s - b.latency_s) <= u * max(a.latency_s, b.latency_s)


def why(prev: Result, r: Result, device: str, rates: dict[str, float] | None = None) -> str:
    """One step against the one before, from what was measured: the times with their
    uncertainty, the stage that moved most, the op that moved most in the profile (when both
    were profiled), and for a precision change this CPU's measured matmul rates."""
    faster = r.latency_s < prev.latency_s
    said = (f"{r.step}: {seconds_text(r.latency_s)} s against {seconds_text(prev.latency_s)} s "
            f"for {prev.step}")
    if _close(prev, r):
        return said + " (within the timing uncertainty: no measurable difference here)."
    said += f" ({prev.latency_s / r.latency_s:.2f}x, {'faster' if faster else 'slower'})"
    parts = []
    deltas = {s: r.stages.get(s, 0.0) - prev.stages.get(s, 0.0)
              for s in set(r.stages) | set(prev.stages)}
    if deltas:
        stage = max(deltas, key=lambda s: -deltas[s] if faster else deltas[s])
        parts.append(f"{stage.replace('_', ' ')} {seconds_text(prev.stages.get(stage))} -> "
                     f"{seconds_text(r.stages.get(stage))} s")
    if r.ops and prev.ops:
        ops = {k: r.ops.get(k, 0.0) - prev.ops.get(k, 0.0) for k in set(r.ops) | set(prev.ops)}
        op = max(ops, key=lambda k: -ops[k] if faster else ops[k])
        parts.append(f"by the profiler, {op} moved most ({seconds_text(prev.ops.get(op, 0.0))} "
                     f"-> {seconds_text(r.ops.get(op, 0.0))} s per image)")
    dtype, before_dtype = r.recipe.get("dtype"), prev.recipe.get("dtype")
    if device == "cpu" and rates and dtype != before_dtype and dtype in rates:
        native = sorted(cpu_flags() & set(NATIVE_BF16))
        parts.append(f"a 512x512 matmul runs at {rates[dtype]:.0f} GFLOP/s in {dtype} against "
                     f"{rates.get(before_dtype, rates['fp32']):.0f} in "
                     f"{before_dtype if before_dtype in rates else 'fp32'} on this CPU (measured "
                     "now)" + ("" if dtype != "bf16" else
                               f"; it has {', '.join(native)}" if native else
                               "; it has no native bf16 (no avx512_bf16 or amx_bf16 in "
                               "/proc/cpuinfo)"))
    return said + (": " + "; ".join(parts) if parts else "") + "."


def after(results: Sequence[Result], device: str, out: str | None,
          rates: dict[str, float] | None = None,
          compiled_ahead: dict[str, float] | None = None, ladder: str = "blog") -> str:
    """The measured ladder beside the published A100 one, each step explained against the
    one before (why), and what to do next. For the course's ladder the blog's figure stands
    beside the step of the same name, which the blog ran its own way (said)."""
    ok = [r for r in results if r.ok and r.latency_s]
    lines = []
    if ok and ok[0].model in BLOG_A100_SECONDS:
        blog = BLOG_A100_SECONDS[ok[0].model]
        base = ok[0].latency_s
        lines.append(f"\n{'step':16} {'here (s)':>9} {'+-':>5} {'vs first':>9}   "
                     f"{'blog A100 (s)':>13} {'vs fp32':>8}")
        for r in ok:
            ref = blog.get(r.step)
            ref_text = f"{ref:13.3f} {blog['fp32'] / ref:7.2f}x" if ref else f"{'-':>13} {'-':>8}"
            u = r.latency_uncertainty
            lines.append(f"{r.step:16} {seconds_text(r.latency_s):>9} "
                         f"{(f'{u:.0%}' if u is not None else '-'):>5} "
                         f"{base / r.latency_s:8.2f}x   {ref_text}")
        lines.append(f"Published: {BLOG_A100_WHERE[ok[0].model]}.")
        if ladder != "blog":
            lines.append("The blog ran its own recipe for each of its steps: its fp32 with TF32 "
                         "on, its compiled steps with max-autotune and its four inductor flags; "
                         "the course's compiled steps here are fusion alone (notebook 04).")
        if ok[0].steps != 30:
            lines.append(f"Here each image has {ok[0].steps} denoising steps, the blog's 30: "
                         "compare the speed-ups, not the seconds.")
    if compiled_ahead:
        lines.append("The compiled steps were compiled ahead, in parallel ("
                     + ", ".join(f"{n}: {s:.0f} s" for n, s in compiled_ahead.items())
                     + "), so their cold start above is a warm cache's.")
    lines.append("\nWhat each step changed here, from what was measured:")
    for prev, r in zip(ok, ok[1:]):
        lines.append("  " + why(prev, r, device, rates))
    for r in ok:
        for flag in r.flags:
            lines.append(f"{r.step}: {flag}.")
    if out:
        lines.append(f"\nThis run is in {out} (results.jsonl, images/, ladder.png); "
                     "`make demo` writes each run to a new folder.")
    lines.append("Next: `make lab`, then open notebooks/00_setup.ipynb "
                 "(docs/workshop.md: how to reach JupyterLab on a remote machine).")
    return "\n".join(lines)


