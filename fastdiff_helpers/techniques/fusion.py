"""Fused QKV projections: one matmul instead of three. Introduced in 05_fused_qkv.ipynb."""

from __future__ import annotations

from ..recipe import RecipeError
from ._state import applied, modules, record, refuse_after
from .attention import is_fused, set_attention


def fuse_qkv(pipe):
    """Fuse the Q, K, V projections of the denoiser and the VAE with diffusers'
    fuse_qkv_projections() (PixArt's through its transformer), keeping the chosen SDPA
    backend. Safe to call twice (the second call does nothing)."""
    from diffusers.models.attention_processor import AttnProcessor

    refuse_after(pipe, "fuse_qkv", "quantize", "compile")
    targets = [m for m in modules(pipe) if not is_fused(m)]
    if not targets:
        return pipe
    for module in targets:
        if any(isinstance(p, AttnProcessor) for p in module.attn_processors.values()):
            raise RecipeError("fuse_qkv needs an SDPA attention (diffusers' fused processor "
                              "calls scaled_dot_product_attention): fdh.set_attention(pipe, "
                              "'sdpa') first.")
        module.fuse_qkv_projections()
    record(pipe, "fuse_qkv", True)
    kind = applied(pipe).get("attention", "sdpa")
    if kind not in ("sdpa", "classic"):
        set_attention(pipe, kind)  # diffusers installs its plain fused processor
    return pipe
