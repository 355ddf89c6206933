"""Each memory saver measured on a fresh pipeline: its peak memory and its time, beside the
pipeline without it.

Introduced in 11_fitting_your_gpu.ipynb."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from .. import checks
from ..errors import FastdiffError
from ..models.loading import call_kwargs, free_memory, load_pipeline, pipeline_device
from ..models.presets import DEFAULT_PROMPT, get_spec
from ..techniques.compile import compile_pipeline
from ..techniques.memory_savers import MEMORY_SAVERS, OFFLOADS, apply_memory_saver
from ..measure.compile_events import events_between, snapshot
from ..measure.bench import time_call
from ..measure.memory import peak_memory
from ..measure.record import median_interval
from ..measure.timing import uncertainty, until_steady

__all__ = ["memory_savers_report"]


def _inactive(pipe, saver: str | None, call: dict[str, Any], batch: int) -> str:
    """Why a VAE saver does nothing at this size or batch (diffusers/models/autoencoders/
    autoencoder_kl.py, _decode: tiling only for latents larger than the tile, slicing only for
    a batch of more than one)."""
    if saver == "vae-tiling" and max(call["height"], call["width"]) <= pipe.vae.tile_sample_min_size:
        return (f"does nothing here: the image is not larger than the VAE's tile "
                f"({pipe.vae.tile_sample_min_size} px, its config's sample_size)")
    if saver == "vae-slicing" and batch < 2:
        return "does nothing here: slicing splits a batch, and the batch is one image"
    return ""


def _measure(model: str, saver: str | None, weights: str, device: str | None, dtype: str,
             kwargs: dict[str, Any], batch: int, compile: bool,
             timing: tuple[int, int]) -> dict[str, Any]:
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

    frames = None
    if compile:
        # after the saver, as a user would; the first call compiles, the measured ones must not
        compile_pipeline(pipe, mode="default")
        run()
        before = snapshot()
    on = "cuda" if saver in OFFLOADS else None
    on_cpu = on is None and pipeline_device(pipe).type == "cpu"
    measured = None if compile and on_cpu else peak_memory(pipe, run, device=on)
    # timed apart from the memory tracker (which slows a CPU call), after one more warm-up
    # call, as fdh.benchmark times: runs until the median is steady (timing.until_steady)
    run()
    where = on or pipeline_device(pipe)
    samples = until_steady(lambda: time_call(run, where)[1], *timing)
    if compile:
        frames = events_between(before, snapshot())["frames"]
        if measured is None:  # the CPU tracker cannot watch compiled code: eager peak instead
            measured = {"peak_bytes": None, "resident_bytes": None, "kind": None,
                        "output": run()}
    row = {"saver": saver or "none", "peak_bytes": measured["peak_bytes"],
           "resident_bytes": measured["resident_bytes"], "kind": measured["kind"],
           "seconds": statistics.median(samples), "seconds_samples": samples,
           "seconds_uncertainty": uncertainty(samples),
           "images": measured["output"], "recompiled_frames": frames,
           "note": _inactive(pipe, saver, call, batch)}
    del pipe
    free_memory()
    return row


def memory_savers_report(model: str = "sdxl", savers: Sequence[str] = MEMORY_SAVERS,
                         weights: str = "tiny", device: str | None = None, dtype: str = "fp32",
                         steps: int = 2, size: int | tuple[int, int] | None = None,
                         batch: int = 1,
                         prompt: str = DEFAULT_PROMPT, compile: bool = False,
                         runs: int = 5, max_runs: int | None = None,
                         verbose: bool = True) -> list[dict[str, Any]]:
    """One row per saver (and "none" first): the peak memory of one call on the pipeline's
    device (fdh.peak_memory), the weights held there before it, the call's seconds (the median
    of `runs` timed calls after a warm-up, more up to `max_runs`, default 4 x runs, until it is
    known within +-5 %, as fdh.benchmark times: "seconds_samples", "seconds_uncertainty"),
    and the change against "none" with the range the two medians' intervals allow. A saver that
    cannot run here (an offload without a GPU) gets a row whose note says why, and so does one
    that does nothing at this size or batch. `batch` images per prompt (VAE slicing shows from
    2), `size` the image size in pixels, one number for a square or (height, width) (VAE tiling
    shows when a side is above the VAE's tile, its config's sample_size; the model's own size
    when left out). `compile=True` compiles the pipeline after the saver (fdh.compile_pipeline,
    default mode), calls it once, and records in
    "recompiled_frames" what the measured calls compiled again (0: the saver composes with
    compile; an error is the row's note); on a CPU the peak is then not measured (the
    tracker sees eager ops only).
    Introduced in 11_fitting_your_gpu.ipynb."""
    unknown = [s for s in savers if s not in MEMORY_SAVERS]
    if isinstance(savers, str) or unknown:
        raise FastdiffError(f"savers={savers!r}: give a list of names from "
                            f"{', '.join(MEMORY_SAVERS)}.")
    checks.whole("runs", runs, 1)
    timing = (runs, max(runs, checks.whole("max_runs", max_runs, 1, none=True) or 4 * runs))
    height, width = _size(model, size)
    kwargs = dict(prompt=prompt, steps=steps, height=height, width=width)
    rows = [_measure(model, None, weights, device, dtype, kwargs, batch, compile, timing)]
    base = rows[0]
    for saver in savers:
        try:
            row = _measure(model, saver, weights, device, dtype, kwargs, batch, compile, timing)
        except FastdiffError as exc:
            row = {"saver": saver, "peak_bytes": None, "resident_bytes": None, "kind": None,
                   "seconds": None, "images": None, "recompiled_frames": None,
                   "note": str(exc).split(". Run")[0] + "."}
        except Exception as exc:  # a saver that fails with compile is a finding, not a crash
            if not compile:
                raise
            row = {"saver": saver, "peak_bytes": None, "resident_bytes": None, "kind": None,
                   "seconds": None, "images": None, "recompiled_frames": None,
                   "note": f"fails with compile: {type(exc).__name__}: {str(exc)[:200]}"}
        if row["seconds"] is not None:
            row["time_change"] = row["seconds"] / base["seconds"] - 1
            row["time_change_range"] = _change_range(row["seconds_samples"],
                                                     base["seconds_samples"])
        if row["peak_bytes"] is not None and base["peak_bytes"]:
            row["peak_change"] = row["peak_bytes"] / base["peak_bytes"] - 1
        rows.append(row)
    if verbose:
        for row in rows:
            print(_line(row, base))
    return rows


def _size(model: str, size: Any) -> tuple[int | None, int | None]:
    """(height, width) from `size`: None, a number (a square) or a (height, width) pair, each
    a multiple of the model's latent grid (checked before any pipeline is loaded)."""
    multiple = get_spec(model).size_multiple
    if not isinstance(size, (tuple, list)):
        side = checks.image_size("size", size, multiple)  # a square, named as it was given
        return side, side
    if len(size) != 2:
        raise FastdiffError(f"size={size!r} cannot work: give one number of pixels (a square) "
                            "or a (height, width) pair, e.g. (96, 48).")
    return (checks.image_size("height", size[0], multiple),
            checks.image_size("width", size[1], multiple))


def _change_range(samples: list[float], base: list[float]) -> tuple[float, float] | None:
    """The change of one median against another that their intervals allow (the lowest over
    the highest, and the reverse, minus one); None without 2+ samples each."""
    if len(samples) < 2 or len(base) < 2:
        return None
    (low, high, _), (base_low, base_high, _) = median_interval(samples), median_interval(base)
    return low / base_high - 1, high / base_low - 1


def _line(row: dict[str, Any], base: dict[str, Any]) -> str:
    if row["seconds"] is None:
        return f"{row['saver']:20} {row['note']}"
    u = row["seconds_uncertainty"]
    text = (f"{row['saver']:20} {row['seconds']:#.3g} s (+-{u:.0%} over "
            f"{len(row['seconds_samples'])} runs)" if u is not None else
            f"{row['saver']:20} {row['seconds']:#.3g} s (one run)")
    if row is not base:
        low_high = row["time_change_range"]
        text += f", time {row['time_change']:+.0%}" + (
            f" ({low_high[0]:+.0%} to {low_high[1]:+.0%})" if low_high else "")
    if row["peak_bytes"] is not None:
        text += (f", peak {row['peak_bytes'] / 2**20:.2f} MiB, weights held "
                 f"{row['resident_bytes'] / 2**20:.2f} MiB")
        if row is not base:
            text += f" ({row['peak_change']:+.0%} peak)"
    if row["recompiled_frames"] is not None:
        text += f", recompiled {row['recompiled_frames']} frame(s)"
    return text + (f"; {row['note']}" if row["note"] else "")
