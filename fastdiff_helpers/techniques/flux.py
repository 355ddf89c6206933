"""Flux.1 in the techniques: what does not apply to it and why, its quantization filter and its
attention (diffusers' own backends). Introduced in 19_flux.ipynb.

Every refusal below is raised before any work, by fdh.apply and by the technique called alone,
and names what to use instead. Each was decided by reading diffusers 0.42.1 (the lines cited)
and is pinned in tests/test_flux.py."""

from __future__ import annotations

import torch

from ..models.loading import family_of, get_denoiser
from .recipe import RecipeError

REFUSED = {
    "classic": (
        "attention='classic' does not exist for Flux: every processor FluxAttention takes "
        "(FluxAttnProcessor, FluxIPAdapterAttnProcessor: diffusers/models/transformers/"
        "transformer_flux.py:279-283) calls scaled-dot-product attention through "
        "dispatch_attention_fn (transformer_flux.py:121), and diffusers' classic AttnProcessor "
        "is written for its Attention class, not FluxAttention. Use attention='sdpa', or a "
        "pinned backend ('sdpa-math', 'sdpa-flash', ...)."),
    "guidance_stop": (
        "The guidance stop halves a doubled batch, and Flux runs none: FLUX.1-dev takes its "
        "guidance scale as an input of the one transformer call per step (pipeline_flux.py:"
        "847-851, embedded with the timestep at transformer_flux.py:726-733), FLUX.1-schnell "
        "has no guidance, and true classifier-free guidance (true_cfg_scale > 1 with a "
        "negative prompt, pipeline_flux.py:771) is a second call (:913-929), not a batch of 2. "
        "For fewer transformer calls use the step cache (cache_every=) or fewer steps."),
    "blog": (
        "quant_filter='blog' is diffusion-fast's int8 filter, written for the linear shapes of "
        "the blog's UNets and PixArt (its 19 excluded shapes); the blog ran no Flux. Use "
        "quant_filter='flux' (diffusers-torchao's choice: every linear of the transformer), "
        "'fastdiff' or 'all'."),
    "regional-extended": (
        "compile_scope='regional-extended' adds the blocks diffusers leaves out of its "
        "regional compile, and for Flux it leaves none: FluxTransformer2DModel declares both "
        "its block classes in _repeated_blocks (transformer_flux.py:572). Use "
        "compile_scope='regional' (diffusers' compile_repeated_blocks)."),
}
NOT_FLUX = ("quant_filter='flux' is Flux's own filter (its transformer's linears, by their "
            "names); this pipeline is no Flux. Use 'fastdiff', 'blog' or 'all'.")

# The top-level modules of FluxTransformer2DModel (transformer_flux.py:631-666) that hold its
# linears; a VAE's linears (its mid-block attention) sit under encoder./decoder.
FLUX_PARTS = ("time_text_embed", "context_embedder", "x_embedder", "transformer_blocks",
              "single_transformer_blocks", "norm_out", "proj_out")

# set_attention's pinned SDPA kernels as diffusers' attention backends for Flux: each runs
# torch's SDPA under sdpa_kernel(that backend) (attention_dispatch.py:3877-3905 for flash)
FLUX_BACKENDS = {"sdpa": "native", "sdpa-flash": "_native_flash",
                 "sdpa-efficient": "_native_efficient", "sdpa-math": "_native_math",
                 "sdpa-cudnn": "_native_cudnn"}


def is_flux(pipe) -> bool:
    return family_of(pipe) == "flux"


def refuse(pipe, what: str) -> None:
    """Raise the refusal `what` (a key of REFUSED) when `pipe` is a Flux pipeline."""
    if is_flux(pipe):
        raise RecipeError(REFUSED[what])


def check_filter(pipe, quant_filter) -> None:
    """Refuse a named filter written for the other family."""
    if quant_filter == "blog":
        refuse(pipe, "blog")
    if quant_filter == "flux" and not is_flux(pipe):
        raise RecipeError(NOT_FLUX)


def refused(recipe) -> list[str]:
    """What of `recipe` cannot apply to Flux: the keys of REFUSED it asks for, in their order."""
    return [what for what, asked in (
        ("classic", recipe.attention == "classic"),
        ("guidance_stop", recipe.guidance_stop is not None),
        ("blog", bool(recipe.quantize) and recipe.quant_filter == "blog"),
        ("regional-extended", bool(recipe.compile) and recipe.compile_scope == "regional-extended"),
    ) if asked]


def check_recipe(pipe, recipe) -> None:
    """Everything of `recipe` that cannot apply to this Flux pipeline, refused before any
    work (fdh.apply); nothing for the other models but the 'flux' filter."""
    if recipe.quantize:
        check_filter(pipe, recipe.quant_filter)
    for what in refused(recipe):
        refuse(pipe, what)


def flux_filter(module, fqn: str) -> bool:
    """The course's Flux filter, diffusers-torchao's choice (inference/benchmark_image.py:
    quantize_(pipeline.transformer, ...) with quantize_'s default filter, every nn.Linear):
    every linear of the transformer, none of the VAE. All 504 of FLUX.1-dev's take the int8
    and fp8 kernels (every size a multiple of 16: pinned in tests/test_flux.py). That includes
    the adaLN modulation linears (norm1, norm1_context, the single blocks' norm, norm_out),
    which see one row each (the timestep and pooled-text embedding) and hold 3.25 of the 11.9
    billion parameters: the course's "fastdiff" filter, written for the UNets and PixArt,
    would keep them (it drops one-token linears by their UNet and PixArt names only).
    Introduced in 19_flux.ipynb."""
    return isinstance(module, torch.nn.Linear) and fqn.split(".")[0] in FLUX_PARTS


def set_flux_attention(pipe, kind: str) -> int:
    """FLUX_BACKENDS[kind] set on each attention module of Flux's transformer, which keeps its
    FluxAttnProcessor (AttentionModuleMixin.set_attention_backend, diffusers/models/
    attention.py:161-168, which sets that module's processor only), not with the model's
    set_attention_backend (modeling_utils.py:608), which also makes the backend diffusers'
    process-wide default (set_active_backend, modeling_utils.py:668): a later pipeline would
    run it unasked. Returns the number of attention modules set."""
    from diffusers.models.attention import AttentionModuleMixin

    if kind == "classic":
        refuse(pipe, "classic")
    attentions = [m for m in get_denoiser(pipe).modules() if isinstance(m, AttentionModuleMixin)]
    for attn in attentions:
        attn.set_attention_backend(FLUX_BACKENDS[kind])
    return len(attentions)
