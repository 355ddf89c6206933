"""Each memory saver measured on a fresh pipeline: its peak memory and its time, beside the
pipeline without it.

Introduced in 18_fitting_your_gpu.ipynb."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..errors import FastdiffError
from ..models.loading import call_kwargs, free_memory, load_pipeline
from ..models.presets import DEFAULT_PROMPT
from ..techniques.memory_savers import MEMORY_SAVERS, OFFLOADS, apply_memory_saver
from .memory import peak_memory

__all__ = ["memory_savers_report"]


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _measure(model: str, saver: str | None, weights: str, device: str | None, dtype: str,
             kwargs: dict[str, Any], batch: int) -> dict[str, Any]:
    # offloads take the pipeline from the CPU themselves; the rest run where it is loaded
    pipe = load_pipeline(model, weights=weights, dtype=dtype, verbose=False,
                         device="cpu" if saver in OFFLOADS else device)
    call = call_kwargs(pipe, **kwargs)
    call.update(output_type="np", num_images_per_prompt=batch)
    if saver is not None:
        embeds = apply_memory_saver(pipe, saver, prompt=call["prompt"])
        if embeds is not None:
            call.pop("prompt")
            call.update(embeds, negative_prompt=None)  # PixArt's default "" would clash

    def run():
        call["generator"] = torch.Generator("cpu").manual_seed(kwargs.get("seed", 0))
        return pipe(**call).images

    measured = peak_memory(pipe, run, device=None if saver not in OFFLOADS else "cuda")
    seconds = _timed(run)  # timed again outside the memory tracker, which slows a CPU call
    row = {"saver": saver or "none", "peak_bytes": measured["peak_bytes"],
           "resident_bytes": measured["resident_bytes"], "kind": measured["kind"],
           "seconds": seconds, "images": measured["output"], "note": ""}
    del pipe
    free_memory()
    return row


def memory_savers_report(model: str = "sdxl", savers: Sequence[str] = MEMORY_SAVERS,
                         weights: str = "tiny", device: str | None = None, dtype: str = "fp32",
                         steps: int = 2, size: int | None = None, batch: int = 1,
                         prompt: str = DEFAULT_PROMPT, verbose: bool = True
                         ) -> list[dict[str, Any]]:
    """One row per saver (and "none" first): the peak memory of one call on the pipeline's
    device (fdh.peak_memory), the weights held there before it, the call's seconds, and the
    change against "none". A saver that cannot run here (an offload without a GPU) gets a row
    whose note says why. `batch` images per prompt (VAE slicing shows from 2), `size` the
    image size (VAE tiling shows above the VAE's tile, its config's sample_size).
    Introduced in 18_fitting_your_gpu.ipynb."""
    unknown = [s for s in savers if s not in MEMORY_SAVERS]
    if isinstance(savers, str) or unknown:
        raise FastdiffError(f"savers={savers!r}: give a list of names from "
                            f"{', '.join(MEMORY_SAVERS)}.")
    kwargs = dict(prompt=prompt, steps=steps, height=size, width=size)
    rows = [_measure(model, None, weights, device, dtype, kwargs, batch)]
    base = rows[0]
    for saver in savers:
        try:
            row = _measure(model, saver, weights, device, dtype, kwargs, batch)
        except FastdiffError as exc:
            row = {"saver": saver, "peak_bytes": None, "resident_bytes": None, "kind": None,
                   "seconds": None, "images": None, "note": str(exc).split(";")[0] + "."}
        if row["peak_bytes"] is not None:
            row["peak_change"] = row["peak_bytes"] / base["peak_bytes"] - 1
            row["time_change"] = row["seconds"] / base["seconds"] - 1
        rows.append(row)
    if verbose:
        for row in rows:
            if row["peak_bytes"] is None:
                print(f"{row['saver']:20} {row['note']}")
                continue
            change = ("" if row is base else f" ({row['peak_change']:+.0%} peak, "
                      f"{row['time_change']:+.0%} time)")
            print(f"{row['saver']:20} peak {row['peak_bytes'] / 2**20:9.2f} MiB, weights held "
                  f"{row['resident_bytes'] / 2**20:8.2f} MiB, {row['seconds']:.2f} s{change}")
    return rows
