"""Fused QKV projections: one matmul instead of three. Introduced in 06_fused_qkv.ipynb."""

from __future__ import annotations

from typing import Any

from ._state import agree, applied, consistent, parts, record, refuse_after
from .attention import is_fused, set_attention
from .recipe import RecipeError


def drop_unfused_projections(module) -> int:
    """Delete the projections diffusers keeps beside the fused ones, so the fused model holds
    no more weights than the unfused one (diffusers 0.42's Attention.fuse_projections copies
    to_q/to_k/to_v into to_qkv, or to_k/to_v into to_kv for a cross-attention, and keeps the
    originals: SDXL's UNet grows from 2.567 B to 3.215 B parameters). FusedAttnProcessor2_0
    reads only to_qkv, or to_q and to_kv. Flux's FluxAttention (AttentionModuleMixin.
    fuse_projections, diffusers/models/attention.py:248) also fuses add_q/k/v_proj into
    to_added_qkv, and FluxAttnProcessor then reads only the fused ones
    (transformer_flux.py:60-73). Unfusing would need the originals: diffusers'
    unfuse_qkv_projections becomes a no-op (the fused processors stay). Returns the number of
    parameters freed."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    freed = 0
    for attn in module.modules():
        if not (isinstance(attn, (Attention, AttentionModuleMixin))
                and getattr(attn, "fused_projections", False)):
            continue
        names = ("to_k", "to_v") if getattr(attn, "is_cross_attention", False) else (
            "to_q", "to_k", "to_v")
        if hasattr(attn, "to_added_qkv"):  # Flux's double blocks: the text stream's, fused too
            names += ("add_q_proj", "add_k_proj", "add_v_proj")
        for name in names:
            if getattr(attn, name, None) is not None:
                freed += sum(p.numel() for p in getattr(attn, name).parameters())
                delattr(attn, name)
    if hasattr(module, "original_attn_processors"):
        module.original_attn_processors = None  # their unfused processors would need to_q...
    return freed


def fuse_qkv(pipe):
    """Fuse the Q, K, V projections of the denoiser and the VAE with diffusers'
    fuse_qkv_projections() (PixArt's through its transformer), keeping the chosen SDPA
    backend. Safe to call twice (the second call does nothing).
    Introduced in 15_fp8_hopper.ipynb; 06_fused_qkv.ipynb fuses by hand and says what this adds."""
    from diffusers.models.attention_processor import AttnProcessor

    refuse_after(pipe, "fuse_qkv", "quantize", "compile")
    targets = [m for m in parts(pipe).values() if not is_fused(m)]
    if not targets:
        return pipe
    for module in targets:
        if any(isinstance(p, AttnProcessor) for p in module.attn_processors.values()):
            raise RecipeError("fuse_qkv needs an SDPA attention (diffusers' fused processor "
                              "calls scaled_dot_product_attention): fdh.set_attention(pipe, "
                              "'sdpa') first.")
        module.fuse_qkv_projections()
        drop_unfused_projections(module)
    record(pipe, "fuse_qkv", True)
    kind = applied(pipe).get("attention", "sdpa")
    if kind not in ("sdpa", "classic"):
        set_attention(pipe, kind)  # diffusers installs its plain fused processor
    return pipe


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """Fused QKV as plain code (fdh.to_code): diffusers' call, then the course's own freeing of
    the unfused copies."""
    reads = ("FluxAttnProcessor reads the fused ones" if flux else
             "diffusers installs its fused SDPA processor")
    return {"fuse_qkv": [f"# fused QKV projections ({reads})",
                         f"{D}.fuse_qkv_projections()", "pipe.vae.fuse_qkv_projections()"],
            "drop_unfused": ["# the course's own: free the unfused copies diffusers keeps",
                             drop_unfused_projections, f"drop_unfused_projections({D})",
                             "drop_unfused_projections(pipe.vae)"]}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """Whether every attention of each part has its projections fused (fdh.current_recipe)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    found = {part: consistent([{bool(getattr(a, "fused_projections", False))}
                               for a in module.modules()
                               if isinstance(a, (Attention, AttentionModuleMixin))])
             for part, module in parts(pipe).items()}
    return {"fuse_qkv": agree(found, (False, True), bool(done.get("fuse_qkv")))}
