"""Will it fit: a model's estimated GPU peak in a dtype, at a size and batch, against a card,
to decide before loading (fdh.peak_memory measures). Introduced in 00_setup.ipynb."""

from __future__ import annotations

import functools
from types import MappingProxyType

import torch

from .. import checks
from ..errors import FastdiffError
from .build import build_component, build_pipeline
from .dtypes import RECIPE_DTYPES, element_bytes, fp32_or_half
from .presets import VAES, get_spec

GIB = 1024 ** 3
# Activations of one image at the native size (the decode or the denoiser's peak; guidance
# runs its two halves as a batch of 2), in bytes, per model and precision ("half": bf16 and
# fp16): a peak (torch.cuda.max_memory_allocated) minus the exact weights, the larger of this
# project's measurement (SDXL on the H100, results/h100-80gb-hbm3/sdxl/results.jsonl
# peak_memory_bytes) and the published one (diffusion-fast's A100 runs: course/planning/published.py
# PEAKS_GIB). tests/test_memory_model.py recomputes each. Flux has no measured or published
# peak: SDXL's, at the same 1024x1024 (an estimate).
ACT_BYTES = {("sdxl", "fp32"): 5.309e9, ("sdxl", "half"): 2.709e9,
             ("ssd1b", "fp32"): 4.161e9, ("ssd1b", "half"): 2.625e9,
             ("sd15", "fp32"): 2.302e9, ("sd15", "half"): 1.165e9,
             ("pixart", "fp32"): 4.528e9, ("pixart", "half"): 2.586e9}
# what torch's allocator does not count (the CUDA context, cuBLAS/cuDNN workspaces, the
# allocator's free-but-cached blocks): a share on top of the estimate, and a fixed part
MARGIN = 0.10
CONTEXT_BYTES = 0.6 * GIB
# SDXL-family pipelines decode in fp32 when their VAE is fp16 and its config says force_upcast
# (diffusers pipeline_stable_diffusion_xl.py `needs_upcasting`): the decode's bytes are fp32's
UPCAST_IN_FP16 = ("StableDiffusionXLPipeline",)


@functools.lru_cache(maxsize=None)
def part_parameters(model: str) -> MappingProxyType[str, int]:
    """Parameters per part of a model key's full-size pipeline (its components' order) or of a
    VAE swap's ("fp16-fix": its root, ""), on the meta device, once per process and read-only
    (every caller gets the cached mapping): the count the fit, the download sizes and
    fdh.weight_bytes ask (bytes: x dtypes.element_bytes)."""
    parts = ({"": build_component(VAES[model][1], "meta", torch.float32)} if model in VAES else
             build_pipeline(get_spec(model), "full", "meta", torch.float32, 0).components)
    return MappingProxyType({name: sum(p.numel() for p in m.parameters())
                             for name, m in parts.items() if isinstance(m, torch.nn.Module)})


def weight_bytes_of(model: str, dtype: str) -> int:
    """Bytes of the full-size pipeline's parameters in `dtype` (meta device, nothing loaded)."""
    return sum(part_parameters(model).values()) * element_bytes(dtype)


def peak_bytes(model: str, dtype: str, height: int | None = None, width: int | None = None,
               batch: int = 1) -> int:
    """The estimated GPU peak of one call: weights + activations (ACT_BYTES), scaled by
    pixels and batch, plus MARGIN and CONTEXT_BYTES. Introduced in 00_setup.ipynb."""
    spec = get_spec(model)
    if dtype not in RECIPE_DTYPES:
        raise FastdiffError(f"dtype={dtype!r} cannot work: use one of "
                            f"{', '.join(RECIPE_DTYPES)}.")
    checks.call_size(None, height, width, spec.size_multiple)
    checks.whole("batch", batch, 1)
    height = height or spec.resolution
    width = width or height
    act_dtype = "fp32" if dtype == "fp16" and spec.pipeline_class in UPCAST_IN_FP16 else dtype
    key = "sdxl" if spec.family == "flux" else spec.key
    acts = (ACT_BYTES[key, fp32_or_half(act_dtype)]
            * height * width / spec.resolution ** 2 * batch)
    return int((weight_bytes_of(spec.key, dtype) + acts) * (1 + MARGIN) + CONTEXT_BYTES)


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
