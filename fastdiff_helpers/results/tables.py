"""A ladder's results as a text table: what run_ladder prints, and the notebooks after it.

Introduced in 02_precision.ipynb (format_table)."""

from __future__ import annotations

from typing import Sequence

from ..measure.record import (Result, denoising_label, memory_text, psnr_text, seconds_text,
                              uncertainty_text)

__all__ = ["format_table"]


def format_table(results: Sequence[Result]) -> str:
    """A text table of a ladder: step, median seconds and how far it may be off (+-, from the
    median's interval: Result.latency_uncertainty), speed-up vs the first timed step (fp32
    in a full ladder) and vs the previous one, peak memory (headed with its kind: CUDA
    allocated or process RSS; CUDA peak reserved, which counts CUDA-graph pools, beside it),
    PSNR vs the baseline, cold start, and a flags column where a result carries a warning
    (Result.flags: e.g. a compilation inside its timed calls). Where the results ran other
    step counts or schedulers, each step's label says its own (measure/record.py denoising_label).

    Introduced in 02_precision.ipynb."""
    timed = [r for r in results if r.error is None and r.latency_s]
    kinds = {r.peak_memory_kind for r in timed if r.peak_memory_kind}
    memory = {frozenset({"cuda_max_allocated"}): "peak allocated",
              frozenset({"process_peak_rss"}): "peak RSS"}.get(frozenset(kinds), "peak memory")
    reserved = any(r.peak_reserved_bytes is not None for r in timed)
    flagged = any(r.flags for r in timed)
    head = ("step", "seconds", "+-", f"vs {timed[0].step if timed else 'first'}", "vs prev",
            memory, *(("peak reserved",) if reserved else ()), "PSNR vs base", "cold start",
            *(("flags",) if flagged else ()))
    rows, first, prev = [], None, None
    for r in results:
        step = r.step + denoising_label(r, timed)  # steps and scheduler, where they differ
        if r.error is not None or not r.latency_s:
            message = (r.error or "no timing").splitlines()[0][:90]
            rows.append((step, f"FAILED: {message}"))
            continue
        first = first or r.latency_s
        rows.append((step, seconds_text(r.latency_s), uncertainty_text(r),
                     f"{first / r.latency_s:.2f}x",
                     f"{prev / r.latency_s:.2f}x" if prev else "-",
                     memory_text(r.peak_memory_bytes),
                     *((memory_text(r.peak_reserved_bytes),) if reserved else ()), psnr_text(r.quality),
                     seconds_text(r.cold_start_s) + " s" if r.cold_start_s is not None else "-",
                     *(("; ".join(r.flags).upper() or "-",) if flagged else ())))
        prev = r.latency_s
    widths = [max([len(head[i])] + [len(row[i]) for row in rows if len(row) > i])
              for i in range(len(head))]  # every step failed: the heads alone
    lines = [head, ["-" * w for w in widths], *rows]  # the heads, a rule under each, the rows
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
                     for line in lines)
