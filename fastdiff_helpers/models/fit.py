"""Will it fit: a model's estimated GPU peak in a dtype, at a size and batch, against a card.

Introduced in 00_setup.ipynb. The weights are exact (the full-size architecture on the meta
device: parameters x bytes); the activations (the denoiser's, the VAE decode's) are scaled from
the one model this project measured on a GPU, SDXL at 1024x1024 on the H100 (ACT_PER_BYTE). The
estimate is for deciding before loading, said as an estimate; fdh.peak_memory measures."""

from __future__ import annotations

import functools

import torch

from ..errors import FastdiffError
from .build import build_pipeline
from .gpus import GpuProfile
from .presets import get_spec

GIB = 1024 ** 3
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Activations at 1024x1024, one image (the denoiser runs its two guidance halves as a batch of
# 2), per byte of the compute dtype: results/h100-80gb-hbm3/sdxl/results.jsonl, peak_memory_bytes
# (torch.cuda.max_memory_allocated) minus the weights: fp32 19.18e9 - 13.88e9 = 5.30e9 (4 bytes),
# bf16 9.65e9 - 6.94e9 = 2.71e9 (2 bytes): 1.33e9 and 1.36e9 a byte; the larger is kept.
# tests/test_fit.py recomputes it from that file. Other models share SDXL's VAE decoder widths
# (128-512 channels at full resolution: the decode is the peak); their denoisers are scaled too.
ACT_PER_BYTE = 1.36e9
# what torch's allocator does not count (the CUDA context, cuBLAS/cuDNN workspaces, the
# allocator's free-but-cached blocks): a share on top of the estimate, and a fixed part
MARGIN = 0.10
CONTEXT_BYTES = 0.6 * GIB
# SDXL-family pipelines decode in fp32 when their VAE is fp16 and its config says force_upcast
# (diffusers pipeline_stable_diffusion_xl.py `needs_upcasting`): the decode's bytes are fp32's
UPCAST_IN_FP16 = ("StableDiffusionXLPipeline",)


@functools.lru_cache(maxsize=None)
def weight_bytes_of(model: str, dtype: str) -> int:
    """Bytes of the full-size pipeline's parameters in `dtype` (meta device, nothing loaded)."""
    pipe = build_pipeline(get_spec(model), "full", "meta",
                          DTYPES["fp32" if dtype == "tf32" else dtype], 0)
    return sum(p.numel() * p.element_size() for m in pipe.components.values()
               if isinstance(m, torch.nn.Module) for p in m.parameters())


def peak_bytes(model: str, dtype: str, height: int | None = None, width: int | None = None,
               batch: int = 1) -> int:
    """The estimated GPU peak of one call: weights + activations (ACT_PER_BYTE), scaled by
    pixels and batch, plus MARGIN and CONTEXT_BYTES. Introduced in 00_setup.ipynb."""
    spec = get_spec(model)
    height = height or spec.resolution
    width = width or height
    act_dtype = dtype
    if dtype == "fp16" and spec.pipeline_class in UPCAST_IN_FP16:
        act_dtype = "fp32"
    acts = ACT_PER_BYTE * ELEMENT_BYTES[act_dtype] * height * width / 1024 ** 2 * batch
    return int((weight_bytes_of(spec.key, dtype) + acts) * (1 + MARGIN) + CONTEXT_BYTES)


def fits(profile: GpuProfile, model: str, dtype: str, height: int | None = None,
         width: int | None = None, batch: int = 1) -> tuple[bool, str]:
    """(fits, what it needs against what the card has), e.g. "est. 11.9 of 14.8 GiB"."""
    need = peak_bytes(model, dtype, height, width, batch)
    return need <= profile.total_bytes, f"est. {need / GIB:.1f} of {profile.gib:.1f} GiB"


def check_fits(model: str, dtype: str, device: str) -> None:
    """Refuse, before any loading, a full-size pipeline whose estimated peak (peak_bytes, at
    its native size) is more than the GPU has free now, saying what to do: a pipeline still
    alive from an earlier cell (`del pipe; fdh.free_memory()`), a smaller card, half precision.
    Introduced in 00_setup.ipynb."""
    free, total = torch.cuda.mem_get_info(device)
    need = peak_bytes(model, dtype)
    if need <= free:
        return
    held = total - free
    alive = (f" {held / GIB:.1f} GiB are in use already: free an earlier pipeline first (`del "
             "pipe; fdh.free_memory()`)," if held > CONTEXT_BYTES + GIB else "")
    raise FastdiffError(
        f"{model} in {dtype} needs an estimated {need / GIB:.1f} GiB on this GPU (models/fit.py "
        f"peak_bytes, at its native size), and {free / GIB:.1f} of {total / GIB:.1f} GiB are "
        f"free:{alive} or load it in half precision (dtype='bf16', or 'fp16' below compute "
        "capability 8.0), or run this cell on a larger card (python -m fastdiff_helpers plan "
        "--gpu ... says which cells fit which card). Nothing was loaded.")
