"""Recompiles: what a compiled pipeline recompiles for when the resolution or a weight changes.

Introduced in 05_cold_start.ipynb."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..errors import FastdiffError
from ..checks import arg
from ..models.loading import call_kwargs, get_denoiser
from ..measure.compile_events import events_between, recompile_reasons, snapshot

__all__ = ["recompile_report"]


def _swap_a_weight(pipe) -> str:
    """Replace one attention projection's weight with a LoRA-shaped update (W + B @ A, rank
    4) as a new Parameter of the same shape: a new tensor, as `module.weight = Parameter(...)`
    makes. (peft's fuse_lora adds into the same tensor instead, in place:
    peft/tuners/lora/layer.py:1008, `base_layer.weight.data += delta_weight`.)"""
    denoiser = get_denoiser(pipe)
    name, linear = next((n, m) for n, m in denoiser.named_modules()
                        if isinstance(m, torch.nn.Linear) and n.endswith(("to_q", "to_qkv")))
    out_features, in_features = linear.weight.shape
    generator = torch.Generator("cpu").manual_seed(0)
    down = torch.randn(4, in_features, generator=generator) * 0.01
    up = torch.randn(out_features, 4, generator=generator) * 0.01
    with torch.no_grad():
        delta = (up @ down).to(linear.weight.device, linear.weight.dtype)
        # same shape, dtype, device and requires_grad as before: a requires_grad that differs
        # is a guard failure of its own (dynamo guards every parameter's requires_grad)
        linear.weight = torch.nn.Parameter(linear.weight + delta,
                                           requires_grad=linear.weight.requires_grad)
    return name


def recompile_report(pipe, sizes: Sequence[int | tuple[int, int]], swap_weight: bool = True,
                     steps: int = 2, verbose: bool = True) -> list[dict[str, Any]]:
    """Call a compiled pipeline at each size in `sizes` (an int is square), then, with
    `swap_weight`, once more after replacing one projection's weight with a LoRA-shaped update.
    Returns one row per call: what changed, frames compiled, compile seconds, the call's
    seconds, and dynamo's recompile reasons new since the call before.
    Introduced in 05_cold_start.ipynb."""
    rows: list[dict[str, Any]] = []
    if isinstance(sizes, (int, str)) or not all(
            isinstance(s, int) or (isinstance(s, tuple) and len(s) == 2) for s in sizes):
        raise FastdiffError(f"{arg('sizes', sizes)} cannot work: give a list of sizes, each an "
                            "int (square) or a (height, width) pair, e.g. [64, (64, 96)].")
    plan: list[tuple[str, Any]] = [(f"{h}x{w}", (h, w)) for h, w in
                                   ((s, s) if isinstance(s, int) else s for s in sizes)]
    for _, (height, width) in plan:  # every size checked before the first call
        call_kwargs(pipe, steps=steps, height=height, width=width)
    if swap_weight:
        plan.append(("LoRA-shaped weight swap", plan[-1][1] if plan else (None, None)))
    for what, (height, width) in plan:
        if what.startswith("LoRA"):
            what = f"{what} ({_swap_a_weight(pipe)})"
        seen = {k: len(v) for k, v in recompile_reasons().items()}
        kwargs = call_kwargs(pipe, steps=steps, height=height, width=width)
        kwargs["output_type"] = "latent"
        before, start = snapshot(), time.perf_counter()
        pipe(**kwargs)
        seconds = time.perf_counter() - start
        events = events_between(before, snapshot())
        reasons = [r for k, v in recompile_reasons().items() for r in v[seen.get(k, 0):]]
        rows.append({"call": what, "frames_compiled": events["frames"],
                     "compile_s": events["compile_s"], "seconds": seconds, "reasons": reasons})
        if verbose:
            print(f"{what:40} compiled {events['frames']} frame(s) in {events['compile_s']:.1f} s"
                  f" (call {seconds:.1f} s)" + "".join(f"\n    - {r}" for r in reasons[:3]))
    return rows
