"""techniques: the recipe and the surgery, one function per technique, and apply(pipe, recipe)
to compose them. Introduced in 01_baseline.ipynb (apply) and one notebook per technique.

    recipe         Recipe (the course's toggles, validated on construction), the one policy
    precision      fp32, TF32, bf16, fp16
    attention      the classic processor, SDPA and its pinned backends
    compile        torch.compile: modes, inductor flags, channels_last, regional, graph breaks
    fusion         fused QKV projections
    syncs          finding and removing device-to-host syncs in the loop
    quantization   dynamic int8, weight-only int8, fp8 with torchao; the 1x1-conv swap
    codegen        fdh.to_code(recipe): the surgery as source to paste
    schedulers     fewer steps: another diffusers scheduler in place of the pipeline's own,
                   few-step distilled weights loaded with theirs
    step_cache     a step cache (DeepCache-style for UNets, a block cache for PixArt and Flux)
    cache_paths    the denoiser cut in two for it: the full and the cached path, for the
                   UNet, PixArt's blocks and Flux's double- and single-stream blocks
    guidance       classifier-free guidance stopped after a share of the steps
    lora           LoRA files found and read from their header; LoRAs loaded, and hot-swapped
                   on a compiled pipeline (checked first)
    memory_savers  the offloads, VAE slicing and tiling, the text encoders dropped after
                   encoding
    flux           Flux.1: what does not apply to it and why, its filter, its attention

Imports the models (a technique acts on a loaded pipeline), nothing of measure, results,
course or runs. diffusers, torchao, peft, accelerate and torch's dynamo internals are
imported inside the functions that use them: importing them takes seconds, and `import
fastdiff_helpers` must stay cheap (tests/test_env.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ..models.dtypes import weight_dtype
from ..models.loading import pipeline_device, pipeline_info
from ..models.noise import quiet_known_noise
from . import attention, compile as comp, fusion, guidance, precision, quantization, step_cache as cache, syncs
from .attention import check_attention, set_attention
from .compile import (capture_denoiser_inputs, check_scope, compile_pipeline,
                      graph_breaks, set_channels_last)
from .flux import check_recipe
from .fusion import fuse_qkv
from .precision import set_precision, tf32_state
from .quantization import blog_filter, conv1x1_to_linear, fastdiff_filter, quantize
from .recipe import Recipe, RecipeError
from .syncs import count_syncs, remove_syncs
from .guidance import stop_guidance
from .step_cache import check_branch, step_cache

@dataclass(frozen=True)
class Step:
    """One technique of fdh.apply, as every surface reads it: `on` (does the recipe ask for
    it), `apply` (the helper calls on a pipeline), `fdh` (those calls as code), `code` (the
    technique alone in plain diffusers / torch / torchao code, section by section:
    fdh.to_code). The Recipe fields it applies are those whose Knob names it
    (techniques/recipe.py KNOBS). STEPS lists them in the order fdh.apply runs them."""
    name: str
    on: Callable[[Recipe], bool]
    apply: Callable[[Any, Recipe], Any]
    fdh: Callable[[Recipe], list[str]]
    code: Callable[..., dict[str, list]]
    read: Callable[[Any, dict], dict[str, Any]]
    sections: tuple[str, ...] = ()


def _precision_fdh(r: Recipe) -> list[str]:
    tf32 = f", tf32={r.tf32!r}" if r.tf32 else ""
    return [f"fdh.set_precision(pipe, {r.dtype!r}{tf32})"]


def _fuse(pipe, r: Recipe) -> None:
    set_attention(pipe, r.attention)  # diffusers' fused processors need an SDPA one first
    fuse_qkv(pipe)


STEPS: tuple[Step, ...] = (
    Step("precision", lambda r: True, lambda pipe, r: set_precision(pipe, r.dtype, r.tf32),
         _precision_fdh, precision.code, precision.read, ("precision",)),
    Step("conv1x1_to_linear", lambda r: bool(r.conv1x1_to_linear),
         lambda pipe, r: conv1x1_to_linear(pipe, r.conv1x1_to_linear),
         lambda r: [f"fdh.conv1x1_to_linear(pipe, {r.conv1x1_to_linear!r})"],
         quantization.conv_code, quantization.conv_read, ("conv1x1_to_linear",)),
    Step("fuse_qkv", lambda r: r.fuse_qkv, _fuse,
         lambda r: [f"fdh.set_attention(pipe, {r.attention!r})", "fdh.fuse_qkv(pipe)"],
         fusion.code, fusion.read, ("fuse_qkv", "drop_unfused")),
    Step("attention", lambda r: True, lambda pipe, r: set_attention(pipe, r.attention),
         lambda r: [f"fdh.set_attention(pipe, {r.attention!r})"], attention.code,
         attention.read, ("attention",)),
    Step("channels_last", lambda r: r.channels_last, lambda pipe, r: set_channels_last(pipe),
         lambda r: ["fdh.set_channels_last(pipe)"], comp.channels_last_code,
         comp.channels_last_read, ("channels_last",)),
    Step("quantize", lambda r: bool(r.quantize),
         lambda pipe, r: quantize(pipe, r.quantize, r.quant_filter),
         lambda r: [f"fdh.quantize(pipe, {r.quantize!r}, quant_filter={r.quant_filter!r})"],
         quantization.code, quantization.read, ("quantize",)),
    Step("no_sync", lambda r: r.no_sync, lambda pipe, r: remove_syncs(pipe),
         lambda r: ["fdh.remove_syncs(pipe)"], syncs.code, syncs.read, ("no_sync_plan", "no_sync")),
    Step("step_cache", lambda r: r.cache_every > 1,
         lambda pipe, r: step_cache(pipe, r.cache_every, r.cache_branch),
         lambda r: [f"fdh.step_cache(pipe, every={r.cache_every}, branch={r.cache_branch})"],
         cache.code, cache.read, ("step_cache",)),
    Step("guidance_stop", lambda r: r.guidance_stop is not None,
         lambda pipe, r: stop_guidance(pipe, r.guidance_stop),
         lambda r: [f"fdh.stop_guidance(pipe, {r.guidance_stop!r})"], guidance.code,
         guidance.read, ("guidance_stop",)),
    Step("compile", lambda r: bool(r.compile),
         lambda pipe, r, **kw: compile_pipeline(pipe, r.compile, r.compile_scope, r.compile_vae,
                                                r.fullgraph, r.dynamic, r.inductor_flags, **kw),
         lambda r: [f"fdh.compile_pipeline(pipe, mode={r.compile!r}, scope={r.compile_scope!r}, "
                    f"compile_vae={r.compile_vae}, fullgraph={r.fullgraph}, "
                    f"dynamic={r.dynamic}, inductor_flags={r.inductor_flags})"],
         comp.code, comp.read, ("compile",)),
)


def current_recipe(pipe, records: bool = True) -> dict:
    """The recipe this pipeline really runs, as a dict of Recipe fields, read back off every
    part each technique changes (each step's `read`: the weights' dtype, the attention
    processors, fused projections, channels_last, swapped convs, torchao's quantized weights
    and the filter that chose them, a step plan, dynamo's and inductor's wrappers) and torch's
    TF32 switch. The helpers' records (fdh.apply, or a technique applied alone) decide between
    values the modules cannot tell apart and give what no module shows (a TF32 mode's name,
    sync removal where nothing needed moving, the SD models' guidance callback, `dynamic`);
    `records=False` reads the modules alone, as a pipeline your own code changed reads. A
    notebook's plain technique cell (`pipe.fuse_qkv_projections()`, `quantize_(...)`,
    `torch.compile(...)`) is read so, and its Result says what ran. A technique applied to
    some of the parts it changes reads as what each part is ("unet: True, vae: False"), which
    no Recipe takes. Introduced in 12_cuda_graphs.ipynb."""
    done = pipeline_info(pipe).applied if records else {}
    found = {name: value for step in STEPS for name, value in step.read(pipe, done).items()}
    return {f.name: found[f.name] for f in dataclasses.fields(Recipe)}


def apply(pipe, recipe: Recipe, tuning: Callable | None = None):
    """Validate `recipe` for this pipeline's device, then apply it in the fixed order:
    precision, 1x1 conv swap, fused QKV, attention, channels_last, quantization, sync
    removal, step cache, guidance stop, compile. (diffusion-fast swaps the convs after channels_last, just before
    quantizing; the two orders give the same module, since a swapped conv has no 4-D weight.)
    Recorded on the pipeline (fdh.pipeline_info(pipe).recipe).

    GPU-only choices follow the course's one policy (fdh.Recipe): CUDA graphs where they cannot
    run are dropped (Recipe.for_device; each change printed, and kept in
    fdh.pipeline_info(pipe).notes for the Result), hardware the machine lacks is refused.
    A pipeline takes one recipe: applying the same one again does nothing, another is
    refused (load a fresh pipeline). `tuning`: whether a compile that would tune may, decided
    above the core and passed to compile_pipeline (the course's: fdh.course.settings(...)
    .tuning; None: it compiles what the recipe says, as fdh.to_code writes it).
    Introduced in 01_baseline.ipynb."""
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"apply() takes a fdh.Recipe, not {type(recipe).__name__}.")
    info = pipeline_info(pipe)
    if info.recipe is not None:
        if recipe in (info.recipe, info.requested):
            return pipe
        raise RecipeError("This pipeline already has a recipe applied; load a fresh pipeline "
                          "(fdh.load_pipeline) to apply another.")
    if info.applied:
        raise RecipeError(f"Techniques were already applied one by one "
                          f"({', '.join(info.applied)}); load a fresh pipeline for apply().")
    quiet_known_noise()
    device = pipeline_device(pipe)
    requested = recipe
    recipe, notes = recipe.for_device(str(device))  # the policy: changes first, said below
    recipe.check_device(str(device))                # then refusals, before any work
    check_recipe(pipe, recipe)                       # what cannot apply to this model (Flux)
    if recipe.compile:
        check_scope(pipe, recipe.compile_scope)
    if recipe.cache_every > 1:
        check_branch(pipe, recipe.cache_branch)
    check_attention(pipe, recipe.attention, str(weight_dtype(recipe.dtype)).removeprefix("torch."))
    if recipe.quantize and recipe.compile is None:
        warnings.warn(f"quantize={recipe.quantize!r} without torch.compile: on a GPU the "
                      "quantized matmuls need compile to fuse and are slower without it (the "
                      "diffusers-torchao project measured CogVideoX-5b on an A100: int8 dynamic "
                      "550 s eager, 243 s bf16, 177 s int8 dynamic compiled); add "
                      "compile='max-autotune', and measure both on your machine.", stacklevel=2)

    for note in notes:
        print(f"fastdiff: {note}")
    for step in STEPS:
        if step.on(recipe):
            step.apply(pipe, recipe, **({"recipe": requested, "tuning": tuning}
                                        if step.name == "compile" else {}))
    if "autotune" in info.applied:  # tuning changed or confirmed the mode: the record says
        recipe = dataclasses.replace(recipe, compile=info.applied["compile"]["mode"],
                                     inductor_flags=bool(info.applied.get("inductor_flags")))
    info.notes = [*notes, *info.notes]  # the tuning decision's (compile_pipeline)
    info.recipe, info.requested = recipe, requested
    return pipe


__all__ = ["apply", "current_recipe", "set_precision", "set_attention", "set_channels_last",
           "compile_pipeline", "fuse_qkv", "remove_syncs", "quantize", "conv1x1_to_linear",
           "graph_breaks", "count_syncs", "capture_denoiser_inputs", "blog_filter",
           "fastdiff_filter", "tf32_state", "RecipeError", "step_cache", "stop_guidance"]
