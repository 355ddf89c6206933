"""The techniques of the course, one function each, and apply(pipe, recipe) to compose them.

Introduced in 01_baseline.ipynb (apply) and one notebook per technique."""

from __future__ import annotations

import warnings

import torch

from ..loading import pipeline_device, pipeline_info
from ..recipe import Recipe, RecipeError
from .attention import SDPABackendProcessor, set_attention
from .compile import (capture_denoiser_inputs, compile_pipeline, graph_breaks,
                      set_channels_last, set_inductor_flags)
from .fusion import fuse_qkv
from .precision import set_precision, set_tf32
from .quantization import Conv1x1Linear, blog_filter, conv1x1_to_linear, quantize
from .syncs import count_syncs, remove_syncs

UNCOMPILED_QUANT_WARNING = (
    "quantize={kind!r} without torch.compile runs, but slower than bf16: the quantized "
    "matmuls need compile to fuse (measured on FLUX by the diffusers-torchao project: 130 s "
    "int8 dynamic eager against 6.6 s bf16). Add compile='max-autotune' on a GPU.")


def apply(pipe, recipe: Recipe):
    """Validate `recipe` for this pipeline's device, then apply it in the fixed order:
    precision, 1x1 conv swap, fused QKV, attention, channels_last, quantization, sync
    removal, compile. Recorded on the pipeline (fdh.pipeline_info(pipe)["recipe"]).

    A pipeline takes one recipe: applying the same one again does nothing, another is
    refused (load a fresh pipeline)."""
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"apply() takes a fdh.Recipe, not {type(recipe).__name__}.")
    info = pipeline_info(pipe)
    if info.get("recipe") is not None:
        if info["recipe"] == recipe:
            return pipe
        raise RecipeError("This pipeline already has a recipe applied; load a fresh pipeline "
                          "(fdh.load_pipeline) to apply another.")
    if info["applied"]:
        raise RecipeError(f"Techniques were already applied one by one "
                          f"({', '.join(info['applied'])}); load a fresh pipeline for apply().")
    device = pipeline_device(pipe)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    recipe.check_device(str(device), capability)
    if recipe.quantize and recipe.compile is None:
        warnings.warn(UNCOMPILED_QUANT_WARNING.format(kind=recipe.quantize), stacklevel=2)

    set_precision(pipe, recipe.dtype)
    if recipe.conv1x1_to_linear:
        conv1x1_to_linear(pipe)
    if recipe.fuse_qkv:
        set_attention(pipe, recipe.attention)
        fuse_qkv(pipe)
    set_attention(pipe, recipe.attention)
    if recipe.channels_last:
        set_channels_last(pipe)
    if recipe.quantize:
        quantize(pipe, recipe.quantize, recipe.quant_filter)
    if recipe.no_sync:
        remove_syncs(pipe)
    if recipe.compile:
        compile_pipeline(pipe, recipe.compile, recipe.compile_scope, recipe.compile_vae,
                         recipe.fullgraph, recipe.dynamic, recipe.inductor_flags)
    info["recipe"] = recipe
    return pipe


__all__ = ["apply", "set_precision", "set_tf32", "set_attention", "set_channels_last",
           "compile_pipeline", "set_inductor_flags", "fuse_qkv", "remove_syncs", "quantize",
           "conv1x1_to_linear", "graph_breaks", "count_syncs", "capture_denoiser_inputs",
           "blog_filter", "Conv1x1Linear", "SDPABackendProcessor", "RecipeError"]
