"""Attention: diffusers' classic processor, or scaled-dot-product attention and its backends.

Introduced in 03_attention.ipynb."""

from __future__ import annotations

from ..recipe import ATTENTION, RecipeError
from ._state import modules, record, refuse_after

SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                 "sdpa-math": "MATH", "sdpa-cudnn": "CUDNN_ATTENTION"}


class SDPABackendProcessor:
    """diffusers' SDPA processor (plain or fused) run under torch's sdpa_kernel(backend).

    Hand-written because diffusers has no per-processor backend switch for these models and
    sdpa_kernel is a context manager that must wrap every attention call."""

    def __init__(self, backend: str, fused: bool = False):
        from diffusers.models.attention_processor import AttnProcessor2_0, FusedAttnProcessor2_0

        self.inner = FusedAttnProcessor2_0() if fused else AttnProcessor2_0()
        self.backend = backend

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 temb=None, *args, **kwargs):
        import torch

        with torch.nn.attention.sdpa_kernel(getattr(torch.nn.attention.SDPBackend, self.backend)):
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb,
                              *args, **kwargs)


def is_fused(module) -> bool:
    return any(getattr(m, "fused_projections", False) for m in module.modules())


def make_processor(kind: str, fused: bool):
    from diffusers.models.attention_processor import (AttnProcessor, AttnProcessor2_0,
                                                      FusedAttnProcessor2_0)

    if kind == "classic":
        return AttnProcessor()
    if kind == "sdpa":
        return FusedAttnProcessor2_0() if fused else AttnProcessor2_0()
    return SDPABackendProcessor(SDPA_BACKENDS[kind], fused)


def set_attention(pipe, kind: str = "sdpa"):
    """Set the attention processor of the denoiser and the VAE.

    "classic" is diffusers' AttnProcessor (explicit softmax(QK^T)V, the blog's baseline);
    "sdpa" is torch's scaled_dot_product_attention, letting torch pick the kernel;
    "sdpa-flash" / "-efficient" / "-math" / "-cudnn" force one backend."""
    if kind not in ATTENTION:
        raise RecipeError(f"Unknown attention {kind!r}. Use one of: {', '.join(ATTENTION)}.")
    refuse_after(pipe, "set_attention", "compile")
    for module in modules(pipe):
        fused = is_fused(module)
        if fused and kind == "classic":
            raise RecipeError("This pipeline has fused QKV projections, which need an SDPA "
                              "attention: use 'sdpa' (or load a fresh pipeline).")
        module.set_attn_processor(make_processor(kind, fused))
    record(pipe, "attention", kind)
    return pipe
