"""The shapes max-autotune benchmarks, counted on meta copies of a full-size model
(models/meta.py): what the course's tuning estimate (autotune.py) and clock (clock.py) rest on,
and what 13_autotuning.ipynb counts (fdh.course.gemm_shapes). The size of the graphs inductor
compiles, their other basis, is counted by tools/graph_ops.py.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...models.loading import native_resolution, pipeline_spec
from ...models.meta import (Key, denoiser_inputs, meta_copy, module_key, pooled_dim, spec_key,
                            vae_latents)
from ...models.presets import ModelSpec, get_spec

__all__ = ["gemm_shapes"]


def _recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    # what inductor's max-autotune tunes with its GEMM/convolution templates (mm, addmm,
    # convolution: torch/_inductor/kernel/mm.py, conv.py); the attention's bmm goes to SDPA's
    # own kernels on a GPU, so a meta run's decomposed bmm is not counted
    tuned = {aten.mm, aten.addmm, aten.convolution}

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: set[tuple] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in tuned:
                shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
                rest = repr([a for a in args if not isinstance(a, torch.Tensor)])
                self.seen.add((func.overloadpacket.__name__, shapes, rest))
            return func(*args, **(kwargs or {}))

    return Shapes()


@functools.lru_cache(maxsize=32)
def _shapes(key: Key, inputs: str, batch: int, height: int, width: int, tokens: int,
            pooled: int | None) -> frozenset:
    model = torch.nn.Module.to(meta_copy(key), torch.bfloat16)  # diffusers own .to() warns
    recorder = _recorder()
    with torch.no_grad(), recorder:
        if inputs == "vae":
            model.decode(vae_latents(model, height, width, torch.bfloat16))
        else:
            model(**denoiser_inputs(model, batch, height, width, tokens, pooled,
                                    torch.bfloat16))
    return frozenset(recorder.seen)


def gemm_shapes(pipe_or_model: Any, height: int | None = None, width: int | None = None,
                vae: bool = True) -> int:
    """How many distinct GEMM and convolution shapes (mm, addmm, convolution, with their
    strides and padding) one bf16 denoiser call, at the batch classifier-free guidance gives
    it, and (with `vae`) one VAE decode run at height x width (default: the model's native
    size): what max-autotune benchmarks one by one on a big GPU. Counted on meta copies.
    SDXL's UNet at 1024x1024 has 42, the number an H100's max-autotune compile autotuned
    (results/h100-80gb-hbm3/sdxl/compile-attempts.log); the architecture before any surgery
    (fused QKV and the 1x1-conv swap move a few shapes between kinds).
    Introduced in 13_autotuning.ipynb."""
    if isinstance(pipe_or_model, (str, ModelSpec)):
        spec = get_spec(pipe_or_model)
        keys = {name: spec_key(c) for name, c in spec.full.items()}
        size = spec.resolution
    else:
        spec = pipeline_spec(pipe_or_model)
        names = (spec.denoiser, "vae", "text_encoder_2")
        keys = {n: module_key(getattr(pipe_or_model, n)) for n in names
                if getattr(pipe_or_model, n, None) is not None}
        size = native_resolution(pipe_or_model)
    height, width = height or size, width or size
    batch = 2 if spec.cfg and spec.guidance > 1.0 else 1
    seen = _shapes(keys[spec.denoiser], "denoiser", batch, height, width, spec.max_tokens,
                   pooled_dim(keys))
    if vae:  # a shape both run is benchmarked once (inductor's timings are per shape)
        seen |= _shapes(keys["vae"], "vae", 1, height, width, 0, None)
    return len(seen)
