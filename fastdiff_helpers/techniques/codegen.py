"""fdh.to_code(recipe): the surgery as source to paste into your own notebook.

"fdh" writes one helper call per technique; "plain" writes the same steps with diffusers,
torch and torchao only: the technique alone, what turns a stock diffusers pipeline into the
recipe (a stock pipeline's defaults, diffusers' SDPA processor and TF32 off for matmuls, are
not written). The plain pieces that have no library equivalent (a backend-pinned
SDPA processor, the 1x1-conv swap, the quantization filter, the sync removal) are emitted
from the helpers' own source with inspect, so plain code and helpers cannot drift apart.
Both run in the order of fdh.apply, and tests execute both against apply().
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Sequence

from ..models.dtypes import fp32_or_half, weight_dtype
from ..models.presets import get_spec
from . import attention, compile as comp, flux as flux_rules, fusion, precision, quantization, syncs
from .recipe import Recipe, RecipeError

_DENOISER = 'denoiser = pipe.unet if hasattr(pipe, "unet") else pipe.transformer'


def _without_docstrings(source: str) -> str:
    """`source` with the docstring of every function and class in it removed: pasted code
    stays short, and the why is in the course's text and in the helpers' own docstrings."""
    lines = source.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                drop.update(range(first.lineno - 1, first.end_lineno))
                if first.end_lineno < len(lines) and not lines[first.end_lineno].strip():
                    drop.add(first.end_lineno)  # the blank line after it
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _source(*objects) -> list[str]:
    return [_without_docstrings(textwrap.dedent(inspect.getsource(o))).rstrip() + "\n"
            for o in objects]


def _fdh(r: Recipe) -> list[str]:
    tf32 = f", tf32={r.tf32!r}" if r.tf32 else ""
    lines = ["import fastdiff_helpers as fdh", "", f"fdh.set_precision(pipe, {r.dtype!r}{tf32})"]
    if r.conv1x1_to_linear:
        lines.append(f"fdh.conv1x1_to_linear(pipe, {r.conv1x1_to_linear!r})")
    if r.fuse_qkv:
        lines += [f"fdh.set_attention(pipe, {r.attention!r})", "fdh.fuse_qkv(pipe)"]
    lines.append(f"fdh.set_attention(pipe, {r.attention!r})")
    if r.channels_last:
        lines.append("fdh.set_channels_last(pipe)")
    if r.quantize:
        lines.append(f"fdh.quantize(pipe, {r.quantize!r}, quant_filter={r.quant_filter!r})")
    if r.no_sync:
        lines.append("fdh.remove_syncs(pipe)")
    if r.cache_every > 1:
        lines.append(f"fdh.step_cache(pipe, every={r.cache_every}, branch={r.cache_branch})")
    if r.guidance_stop is not None:
        lines.append(f"fdh.stop_guidance(pipe, {r.guidance_stop!r})")
    if r.compile:
        lines.append(f"fdh.compile_pipeline(pipe, mode={r.compile!r}, scope={r.compile_scope!r}, "
                     f"compile_vae={r.compile_vae}, fullgraph={r.fullgraph}, "
                     f"dynamic={r.dynamic}, inductor_flags={r.inductor_flags})")
    return lines


SECTIONS = ("precision", "conv1x1_to_linear", "fuse_qkv", "drop_unfused", "attention",
            "channels_last", "quantize", "no_sync_plan", "no_sync", "step_cache",
            "guidance_stop", "compile")


def _flux_attention(r: Recipe, D: str = "denoiser") -> list[str]:
    """Flux's attention as techniques/flux.py sets it: diffusers' backend, per module."""
    backend = flux_rules.FLUX_BACKENDS[r.attention]
    lines = ["# Flux keeps its FluxAttnProcessor; the kernel is diffusers' attention backend, set",
             "# per module (the model's set_attention_backend also sets a process-wide default)",
             "from diffusers.models.attention import AttentionModuleMixin",
             f"for attn in {D}.modules():",
             "    if isinstance(attn, AttentionModuleMixin):",
             f"        attn.set_attention_backend({backend!r})"]
    if r.attention == "sdpa":
        fused = "Fused" if r.fuse_qkv else ""
        return lines + [f"from diffusers.models.attention_processor import {fused}AttnProcessor2_0",
                        f"pipe.vae.set_attn_processor({fused}AttnProcessor2_0())"]
    name = attention.SDPA_BACKENDS[r.attention]
    return (lines + [f"SDPA_LIMITS = {{{name!r}: {attention.SDPA_LIMITS[name]!r}}}", ""]
            + _source(attention.SDPABackendProcessor, attention.pin_backend)
            + [f"pin_backend(pipe.vae, {name!r})"])


def _plain(r: Recipe, flux: bool = False, D: str = "denoiser") -> dict[str, list[str]]:
    """The plain code of `r`, section by section (SECTIONS, in the order of fdh.apply); each
    section holds its own imports and the definitions it calls. `flux`: Flux's attention. `D`:
    how the code names the denoiser (pipe.unet where the model is known)."""
    out: dict[str, list[str]] = {}
    # the technique alone: what turns a stock diffusers pipeline into `r`, so a stock
    # pipeline's own defaults (fp32 weights, TF32 off for matmuls, diffusers' SDPA processor)
    # are not written; a TF32 mode the recipe names is, "off" included
    tf32 = r.tf32 or ("on" if r.dtype == "tf32" else None)
    lines = [] if fp32_or_half(r.dtype) == "fp32" else [f"pipe.to({weight_dtype(r.dtype)})"]
    if tf32 is not None:
        lines += [f"# TF32 {tf32!r}: a process-wide switch"] + precision.tf32_code(tf32, alone=True)
    if lines:
        out["precision"] = lines
    if r.conv1x1_to_linear:
        conv_filter = quantization.CONV_FILTERS[r.conv1x1_to_linear]
        out["conv1x1_to_linear"] = (
            ["# 1x1 convolutions as linears, so quantization reaches them",
             "from torchao.quantization import swap_conv2d_1x1_to_linear"]
            + _source(conv_filter)
            + [f"swap_conv2d_1x1_to_linear({D}, {conv_filter.__name__})",
               f"swap_conv2d_1x1_to_linear(pipe.vae, {conv_filter.__name__})"])
    if r.fuse_qkv:  # never with classic attention (Recipe refuses it)
        reads = ("FluxAttnProcessor reads the fused ones" if flux else
                 "diffusers installs its fused SDPA processor")
        out["fuse_qkv"] = [f"# fused QKV projections ({reads})",
                           f"{D}.fuse_qkv_projections()", "pipe.vae.fuse_qkv_projections()"]
        out["drop_unfused"] = (["# the course's own: free the unfused copies diffusers keeps"]
                               + _source(fusion.drop_unfused_projections)
                               + [f"drop_unfused_projections({D})",
                                  "drop_unfused_projections(pipe.vae)"])
    if flux:
        out["attention"] = _flux_attention(r, D)
    elif r.attention == "classic":
        out["attention"] = ["from diffusers.models.attention_processor import AttnProcessor",
                            f"{D}.set_attn_processor(AttnProcessor())",
                            "pipe.vae.set_attn_processor(AttnProcessor())"]
    elif r.attention != "sdpa":  # "sdpa": diffusers' default processor (AttnProcessor2_0)
        backend = attention.SDPA_BACKENDS[r.attention]
        lines = []
        if backend == "FLASH_ATTENTION":
            lines += ["# flash takes no attention mask: not for PixArt, whose cross-attention "
                      "gets the prompt's mask"]
        lines += ["# what each forced kernel takes (torch's cuda/sdp_utils.cpp)",
                  f"SDPA_LIMITS = {{{backend!r}: {attention.SDPA_LIMITS[backend]!r}}}", ""]
        lines += _source(attention.SDPABackendProcessor, attention.pin_backend)
        out["attention"] = lines + [f"pin_backend({D}, {backend!r})",
                                    f"pin_backend(pipe.vae, {backend!r})"]
    if r.channels_last:
        out["channels_last"] = [f"{D}.to(memory_format=torch.channels_last)",
                                "pipe.vae.to(memory_format=torch.channels_last)"]
    if r.quantize:
        config = type(quantization.quant_config(r.quantize)).__name__
        lines = [f"from torchao.quantization import quantize_, {config}"]
        made = f"{config}(set_inductor_config=False)"
        if r.quantize in ("fp8-dynamic", "fp8-dynamic-row"):
            granularity = "PerRow" if r.quantize == "fp8-dynamic-row" else "PerTensor"
            lines = [f"from torchao.quantization import quantize_, {config}, {granularity}"]
            made = f"{config}(granularity={granularity}(), set_inductor_config=False)"
        named = {"blog": quantization.blog_filter, "fastdiff": quantization.fastdiff_filter,
                 "flux": flux_rules.flux_filter}
        if r.quant_filter in named:
            if r.quant_filter == "blog":
                lines.append("BLOG_EXCLUDED_SHAPES = {" + ", ".join(
                    map(repr, sorted(quantization.BLOG_EXCLUDED_SHAPES))) + "}")
            if r.quant_filter == "flux":
                lines.append(f"FLUX_PARTS = {flux_rules.FLUX_PARTS!r}")
            lines += _source(named[r.quant_filter])
            filt = named[r.quant_filter].__name__
        else:
            lines.append("all_linears = lambda m, fqn: isinstance(m, torch.nn.Linear)")
            filt = "all_linears"
        if r.quantize == "int8-dynamic":
            lines += ["# only linears the int8 kernels take"] + _source(quantization.int8_kernel_ok)
            lines.append(f"int8_filter = lambda m, fqn: {filt}(m, fqn) and int8_kernel_ok(m)")
            filt = "int8_filter"
        elif r.quantize in ("fp8-dynamic", "fp8-dynamic-row"):
            lines += ["# only linears torch's fp8 matmul takes"] + _source(
                quantization.fp8_kernel_ok)
            lines.append(f"fp8_filter = lambda m, fqn: {filt}(m, fqn) and fp8_kernel_ok(m)")
            filt = "fp8_filter"
        out["quantize"] = lines + [
            "# set_inductor_config=False: torchao would set inductor flags process-wide",
            f"quantize_({D}, {made}, filter_fn={filt})",
            f"quantize_(pipe.vae, {made}, filter_fn={filt})"]
    if r.no_sync:
        out["no_sync_plan"] = (["# sync removal: only where diffusers 0.42 leaves a sync in the "
                                "loop"] + _source(syncs.no_sync_plan))
        out["no_sync"] = (_source(syncs.keep_scheduler_on_cpu, syncs.upload_timestep_without_sync)
                          + ["move, why = no_sync_plan(pipe)", "print('no_sync:', why)",
                             "if move:", "    keep_scheduler_on_cpu(pipe)",
                             f"    upload_timestep_without_sync({D})"])
    if r.cache_every > 1:
        # no library has a step cache that compiles for these denoisers (09_fewer_denoiser_calls)
        out["step_cache"] = ["# the course's own step cache: ~250 lines in "
                             "fastdiff_helpers/techniques/cache_paths.py and step_cache.py",
                             "import fastdiff_helpers as fdh",
                             f"fdh.step_cache(pipe, every={r.cache_every}, "
                             f"branch={r.cache_branch})"]
    if r.guidance_stop is not None:
        out["guidance_stop"] = [
            "# guidance on the first share of the steps",
            "import math",
            f"guided = max(1, math.ceil(num_inference_steps * {r.guidance_stop!r} - 1e-9))",
            "if hasattr(pipe, 'unet'):  # diffusers' own callback, passed on each call",
            "    from diffusers.callbacks import SDCFGCutoffCallback, SDXLCFGCutoffCallback",
            "    Cutoff = SDXLCFGCutoffCallback if hasattr(pipe, 'text_encoder_2') else "
            "SDCFGCutoffCallback",
            "    callback = Cutoff(cutoff_step_ratio=None, cutoff_step_index=guided - 1)",
            "    # pipe(prompt, num_inference_steps=num_inference_steps, "
            "callback_on_step_end=callback)",
            "else:  # PixArt's pipeline takes no callback_on_step_end: the course's helper",
            "    import fastdiff_helpers as fdh",
            f"    fdh.stop_guidance(pipe, {r.guidance_stop!r})"]
    if r.compile:
        args = ", ".join([f"mode={r.compile!r}"] + (["fullgraph=True"] if r.fullgraph else [])
                         + ([f"dynamic={r.dynamic}"] if r.dynamic is not None else []))
        lines = []
        if r.inductor_flags:
            flags = comp.blog_inductor_flags(bool(r.quantize) and r.quantize.startswith("int8"))
            lines += ["# the blog's inductor flags, for these compiles only (diffusion-fast set "
                      "them process-wide",
                      "# in torch._inductor.config); options= carries the mode's own settings "
                      "too",
                      "from torch._inductor import list_mode_options",
                      f"options = {{**list_mode_options({r.compile!r}),"]
            lines += [f"           {k!r}: {v}," for k, v in flags.items()]
            lines[-1] = lines[-1].rstrip(",") + "}"
            args = ", ".join(["options=options"] + (["fullgraph=True"] if r.fullgraph else [])
                             + ([f"dynamic={r.dynamic}"] if r.dynamic is not None else []))
        if r.dynamic:
            lines += ["import torch.fx.experimental._config as fx_config  # the guide's switch "
                      "(process-wide)",
                      "fx_config.use_duck_shape = False"]
        if r.compile_scope == "full" and (r.cache_every > 1 or r.guidance_stop is not None):
            # a step plan (the step cache; fdh.stop_guidance on PixArt) is compiled as
            # compile_pipeline does it: the whole denoiser would trace the plan's step counter
            # and compile once per step (measured: 8 frames for 8 steps, against 2)
            lines += ["# a step plan (the step cache, PixArt's guidance stop): its paths, each "
                      "compiled once; the whole", "# denoiser would trace the plan's step "
                      "counter and compile once per step",
                      "from fastdiff_helpers.techniques.step_cache import compile_plan",
                      f"if not compile_plan(pipe, {args}):",
                      f"    {D}.compile({args})"]
        elif r.compile_scope == "full":
            lines.append(f"{D}.compile({args})")
        elif r.compile_scope == "regional":
            lines.append(f"{D}.compile_repeated_blocks({args})")
        elif r.compile_scope == "regional-extended":
            blocks = comp.EXTENDED_BLOCKS
            lines += ["# diffusers' own blocks plus the ones it leaves eager",
                      f"blocks = {blocks['unet']!r} if hasattr(pipe, 'unet') else "
                      f"{blocks['transformer']!r}",
                      f"for block in [m for m in {D}.modules() if type(m).__name__ in "
                      "blocks]:", f"    block.compile({args})"]
        else:
            name = "unet' if hasattr(pipe, 'unet') else 'transformer"
            lines += ["from accelerate.utils import compile_regions",
                      f"setattr(pipe, '{name}', compile_regions({D}, {args}))"]
        if r.compile_vae:
            lines.append(f"pipe.vae.decode = torch.compile(pipe.vae.decode, {args})")
        out["compile"] = lines
    return out


def to_code(recipe: Recipe, flavour: str = "fdh", only: str | Sequence[str] | None = None,
            model: str | None = None) -> str:
    """Python source that applies `recipe` to a loaded `pipe`: flavour "fdh", one
    fastdiff_helpers call per technique; "plain", only diffusers, torch and torchao.
    `only` (plain only) keeps the named sections of SECTIONS, e.g. only="compile": the
    technique's own lines, as a notebook shows them. `model`: the code for that model where
    it differs (Flux's attention; what cannot apply to Flux is refused as fdh.apply refuses
    it); None: the blog's four. Introduced in 04_torch_compile.ipynb."""
    if flavour not in ("fdh", "plain"):
        raise RecipeError(f"Unknown flavour {flavour!r}: use 'fdh' or 'plain'.")
    flux = model is not None and get_spec(model).pipeline_class == "FluxPipeline"
    for what, applies in (("classic", recipe.attention == "classic"),
                          ("guidance_stop", recipe.guidance_stop is not None),
                          ("blog", bool(recipe.quantize) and recipe.quant_filter == "blog"),
                          ("regional-extended", bool(recipe.compile)
                           and recipe.compile_scope == "regional-extended")):
        if flux and applies:
            raise RecipeError(flux_rules.REFUSED[what])
    if callable(recipe.quant_filter):
        raise RecipeError("A callable quant_filter cannot be written as code: paste your "
                          "function and pass it as quant_filter= / filter_fn= yourself.")
    if flavour == "fdh":
        if only is not None:
            raise RecipeError("only= picks sections of the plain code: use flavour='plain'.")
        return "\n".join(_fdh(recipe)).rstrip() + "\n"
    part = "denoiser" if model is None else (
        "pipe.unet" if get_spec(model).denoiser == "unet" else "pipe.transformer")
    sections = _plain(recipe, flux, part)
    wanted = list(SECTIONS) if only is None else [only] if isinstance(only, str) else list(only)
    unknown = [name for name in wanted if name not in SECTIONS]
    if unknown:
        raise RecipeError(f"Unknown section(s) {unknown}: use {', '.join(SECTIONS)}.")
    missing = [name for name in wanted if name not in sections]
    if only is not None and missing:
        raise RecipeError(f"This recipe has no {', '.join(missing)} step: its sections are "
                          f"{', '.join(sections)}.")
    body = ["\n".join(sections[name]).rstrip() for name in SECTIONS
            if name in wanted and name in sections]
    text = "\n\n".join(body)
    head = ["import torch"] if re.search(r"\btorch\.", text) else []
    if part == "denoiser" and re.search(r"(?<![\w(])denoiser[.,)]", text):
        head.append(_DENOISER)
    return "\n\n".join(head + ([text] if text else [])) + "\n"
