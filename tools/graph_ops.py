"""The measurement behind the course clock's graph sizes (course/planning/autotune.py GRAPH_OPS
and VAE_OPS): how many ops dynamo captures in one bf16 call of a full-size part at its native
size, traced on meta copies (no weights, no compile: seconds). A measurement of this project's,
run when a model or the library changes: `.venv/bin/python -m tools.graph_ops sdxl [vae]`;
tests/test_clock.py checks the constants against it."""

from __future__ import annotations

import functools
import sys

import torch

from fastdiff_helpers.models.meta import (denoiser_inputs, meta_copy, pooled_dim, spec_key,
                                          vae_latents)
from fastdiff_helpers.models.noise import quiet_known_noise
from fastdiff_helpers.models.presets import get_spec


@functools.lru_cache(maxsize=16)
def graph_ops(model: str, part: str = "denoiser") -> int:
    """How many ops dynamo captures in one bf16 call of a full-size model's denoiser (at the
    batch classifier-free guidance gives it) or VAE decode, at its native size: the size of
    the graph inductor compiles, traced on meta copies with dynamo's ExplainWithBackend (no
    weights, no compile: seconds). The course clock scales compile times by it.
    Introduced with the course clock (docs/workshop.md: "The course clock")."""
    from torch._dynamo.backends.debugging import ExplainWithBackend

    from torch._dynamo.eval_frame import remove_from_cache

    spec = get_spec(model)
    keys = {name: spec_key(c) for name, c in spec.full.items()}
    module = torch.nn.Module.to(meta_copy(keys[spec.denoiser if part == "denoiser" else "vae"]),
                                torch.bfloat16)
    if part == "denoiser":
        batch = 2 if spec.cfg and spec.guidance > 1.0 else 1
        fn, args = module, denoiser_inputs(module, batch, spec.resolution, spec.resolution,
                                           spec.max_tokens, pooled_dim(keys), torch.bfloat16)
        args = (), {**args, "return_dict": False}
    else:
        fn, args = module.decode, ((vae_latents(module, spec.resolution, spec.resolution,
                                                torch.bfloat16),), {})

    def traced(*a, **k):  # a code object of its own: its cache entries are dropped below
        return fn(*a, **k)

    explainer = ExplainWithBackend("eager")
    try:
        with torch.no_grad():
            torch.compile(traced, backend=explainer)(*args[0], **args[1])
    finally:
        remove_from_cache(traced)
    return explainer.output().op_count


if __name__ == "__main__":
    quiet_known_noise()
    print(graph_ops(*sys.argv[1:3]))
