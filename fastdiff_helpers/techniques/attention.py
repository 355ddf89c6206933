"""Attention: diffusers' classic processor, or scaled-dot-product attention and its backends.

Introduced in 03_attention.ipynb."""

from __future__ import annotations

from typing import Any

from ..models.loading import family_of
from ._state import (agree, consistent, get_denoiser, parts, pipeline_info, record,
                     refuse_after)
from .flux import FLUX_BACKENDS, is_flux, set_flux_attention
from .recipe import ATTENTION, RecipeError

SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                 "sdpa-math": "MATH", "sdpa-cudnn": "CUDNN_ATTENTION"}

# What each forced CUDA kernel accepts (head dim = last dim of q, k and v). Read in pytorch's
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (main at 001f694, the C++ torch 2.13
# dispatches with; not shipped in the wheel): flash: check_head_dim_size_flash (<= 256),
# check_for_attn_mask (no mask), check_dtypes_flash_attention (fp16/bf16); cuDNN:
# check_cudnn_tensor_shapes (<= 128, 256 only on sm90/sm10x with cuDNN > 9.22: not relied on;
# a multiple of 8), check_dtypes_low_precision (fp16/bf16); efficient:
# check_head_dim_size_mem_efficient (a multiple of 8 for fp16/bf16, of 4 for fp32; no maximum),
# fp32 allowed, masks allowed. Math runs anything.
SDPA_LIMITS = {
    "FLASH_ATTENTION": {"max_head_dim": 256, "multiple_of": 1, "mask": False,
                        "dtypes": ("float16", "bfloat16")},
    "CUDNN_ATTENTION": {"max_head_dim": 128, "multiple_of": 8, "mask": True,
                        "dtypes": ("float16", "bfloat16")},
    "EFFICIENT_ATTENTION": {"max_head_dim": None, "multiple_of": 8, "mask": True,
                            "dtypes": ("float16", "bfloat16", "float32")},
    "MATH": {"max_head_dim": None, "multiple_of": 1, "mask": True,
             "dtypes": ("float16", "bfloat16", "float32")},
}


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


def pin_backend(module, backend: str) -> int:
    """Run `backend` on each attention of `module` whose head dim it takes (SDPA_LIMITS), and
    default SDPA on the others (the VAE's single 512-wide head, say). Returns how many it pinned."""
    from diffusers.models.attention_processor import (Attention, AttnProcessor2_0,
                                                      FusedAttnProcessor2_0)

    limits, pinned = SDPA_LIMITS[backend], 0
    for attn in module.modules():
        if not isinstance(attn, Attention):
            continue
        head_dim = attn.inner_dim // attn.heads
        fits = (limits["max_head_dim"] is None or head_dim <= limits["max_head_dim"]) and \
            head_dim % limits["multiple_of"] == 0
        fused = attn.fused_projections
        if fits:
            attn.set_processor(SDPABackendProcessor(backend, fused))
            pinned += 1
        else:
            attn.set_processor(FusedAttnProcessor2_0() if fused else AttnProcessor2_0())
    return pinned


def is_fused(module) -> bool:
    return any(getattr(m, "fused_projections", False) for m in module.modules())


def masked_attentions(pipe) -> list[str]:
    """Names of the denoiser's attentions that the pipeline calls with a mask: PixArt's cross-
    attentions get the prompt's padding mask (diffusers 0.42 pipeline_pixart_alpha.py:935
    passes encoder_attention_mask; attention.py:1043-1046 hands it to attn2)."""
    from diffusers.models.attention_processor import Attention

    if family_of(pipe) != "transformer":  # PixArt-alpha's DiT alone
        return []
    return [name for name, m in get_denoiser(pipe).named_modules()
            if isinstance(m, Attention) and m.is_cross_attention]


def check_attention(pipe, kind: str, dtype: str) -> None:
    """Refuse, before any work, a forced backend this pipeline cannot run anywhere: a dtype the
    kernel does not take, or a mask it refuses. `dtype` is torch's name ("bfloat16", ...)."""
    backend = SDPA_BACKENDS.get(kind)
    if backend is None:
        return
    limits = SDPA_LIMITS[backend]
    if dtype not in limits["dtypes"]:
        raise RecipeError(f"attention={kind!r} runs only in {' or '.join(limits['dtypes'])}; "
                          f"this pipeline is {dtype}. Use dtype='bf16' (fdh.set_precision(pipe, "
                          "'bf16') before set_attention), or attention='sdpa-efficient' / "
                          "'sdpa-math' in fp32.")
    masked = masked_attentions(pipe)
    if masked and not limits["mask"]:
        raise RecipeError(f"attention={kind!r} refuses an attention mask, and this pipeline "
                          f"passes one to {len(masked)} cross-attentions (the prompt's padding "
                          "mask, e.g. " + masked[0] + "). Use 'sdpa-efficient', 'sdpa-cudnn' or "
                          "'sdpa'.")


def set_attention(pipe, kind: str = "sdpa"):
    """Set the attention processor of the denoiser and the VAE.

    "classic" is diffusers' AttnProcessor (explicit softmax(QK^T)V, the blog's baseline);
    "sdpa" is torch's scaled_dot_product_attention, letting torch pick the kernel;
    "sdpa-flash" / "-efficient" / "-math" / "-cudnn" force one backend on every attention
    whose head dim that kernel takes (SDPA_LIMITS; the others keep default SDPA), and refuse
    a dtype or a mask the kernel cannot take (check_attention). Flux's transformer keeps its
    FluxAttnProcessor and gets the kernel from diffusers' attention backends ("classic" is
    refused there: techniques/flux.py); its VAE is set as any other.
    Introduced in 15_fp8_hopper.ipynb; 03_attention.ipynb sets the same processors and
    kernels by hand."""
    from diffusers.models.attention_processor import (AttnProcessor, AttnProcessor2_0,
                                                      FusedAttnProcessor2_0)

    if kind not in ATTENTION:
        raise RecipeError(f"Unknown attention {kind!r}. Use one of: {', '.join(ATTENTION)}.")
    refuse_after(pipe, "set_attention", "compile")
    check_attention(pipe, kind, str(get_denoiser(pipe).dtype).removeprefix("torch."))
    pinned = {}
    for module in parts(pipe).values():
        if module is get_denoiser(pipe) and is_flux(pipe):  # diffusers' own backends
            count = set_flux_attention(pipe, kind)
            pinned[type(module).__name__] = count if kind in SDPA_BACKENDS else 0
            continue
        fused = is_fused(module)
        if fused and kind == "classic":
            raise RecipeError("This pipeline has fused QKV projections, which need an SDPA "
                              "attention: use 'sdpa' (or load a fresh pipeline).")
        if kind in SDPA_BACKENDS:
            pinned[type(module).__name__] = pin_backend(module, SDPA_BACKENDS[kind])
        else:
            module.set_attn_processor(AttnProcessor() if kind == "classic" else
                                      FusedAttnProcessor2_0() if fused else AttnProcessor2_0())
    record(pipe, "attention", kind)
    # how many attentions run the forced kernel, per module (the rest: default SDPA)
    pipeline_info(pipe).attention_pinned = pinned
    return pipe


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The attention as plain code (fdh.to_code); "sdpa" is diffusers' default processor
    (AttnProcessor2_0), nothing to write, but for Flux: its transformer's attention as
    techniques/flux.py sets it, diffusers' backend per module."""
    if flux:
        lines = [
            "# Flux keeps its FluxAttnProcessor; the kernel is diffusers' attention backend, set",
            "# per module (the model's set_attention_backend also sets a process-wide default)",
            "from diffusers.models.attention import AttentionModuleMixin",
            f"for attn in {D}.modules():",
            "    if isinstance(attn, AttentionModuleMixin):",
            f"        attn.set_attention_backend({FLUX_BACKENDS[r.attention]!r})"]
        if r.attention == "sdpa":
            fused = "Fused" if r.fuse_qkv else ""
            return {"attention": lines + [
                f"from diffusers.models.attention_processor import {fused}AttnProcessor2_0",
                f"pipe.vae.set_attn_processor({fused}AttnProcessor2_0())"]}
        pinned = ["pipe.vae"]  # the transformer's kernel is set above
    elif r.attention == "classic":
        return {"attention": ["from diffusers.models.attention_processor import AttnProcessor",
                              f"{D}.set_attn_processor(AttnProcessor())",
                              "pipe.vae.set_attn_processor(AttnProcessor())"]}
    elif r.attention == "sdpa":
        return {}
    else:
        lines = ["# flash takes no attention mask: not for PixArt, whose cross-attention "
                 "gets the prompt's mask"] if r.attention == "sdpa-flash" else []
        lines.append("# what each forced kernel takes (torch's cuda/sdp_utils.cpp)")
        pinned = [D, "pipe.vae"]
    backend = SDPA_BACKENDS[r.attention]
    return {"attention": lines + [f"SDPA_LIMITS = {{{backend!r}: {SDPA_LIMITS[backend]!r}}}", "",
                                  SDPABackendProcessor, pin_backend,
                                  *(f"pin_backend({m}, {backend!r})" for m in pinned)]}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """The attention each part runs (fdh.current_recipe), read off its processors: a pinned
    kernel's processor names its kernel; diffusers' SDPA processor is "sdpa", or a pinned
    kernel whose limits that attention's head does not take (pin_backend leaves it so); Flux's
    transformer, the backend of each attention."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import (Attention, AttnProcessor,
                                                      AttnProcessor2_0, FusedAttnProcessor2_0)

    kinds = {v: k for k, v in SDPA_BACKENDS.items()}
    backends = {v: k for k, v in FLUX_BACKENDS.items()}
    found = {}
    for part, module in parts(pipe).items():
        flux = part == "transformer" and is_flux(pipe)
        told = []
        for attn in module.modules():
            if flux and isinstance(attn, AttentionModuleMixin):
                backend = getattr(attn.processor, "_attention_backend", None)
                told.append({backends.get(getattr(backend, "value", "native"), "sdpa")})
            if flux or not isinstance(attn, Attention):  # Flux's attentions: their backend
                continue
            processor, head = attn.processor, attn.inner_dim // attn.heads
            if getattr(processor, "backend", None) in kinds:  # SDPABackendProcessor, or its
                told.append({kinds[processor.backend]})        # copy in to_code's plain code
            elif type(processor) is AttnProcessor:
                told.append({"classic"})
            elif isinstance(processor, (AttnProcessor2_0, FusedAttnProcessor2_0)):
                told.append({"sdpa"} | {kind for kind, b in SDPA_BACKENDS.items() if not (
                    (SDPA_LIMITS[b]["max_head_dim"] is None or head <= SDPA_LIMITS[b][
                        "max_head_dim"]) and head % SDPA_LIMITS[b]["multiple_of"] == 0)})
        found[part] = consistent(told)
    return {"attention": agree(found, ATTENTION, done.get("attention"))}
