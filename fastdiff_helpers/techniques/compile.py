"""torch.compile: modes, inductor flags, channels_last, regional compile, graph breaks.

Introduced in 04_torch_compile.ipynb."""

from __future__ import annotations

from typing import Any

import torch

from ..loading import call_kwargs, get_denoiser, pipeline_device
from ..recipe import (COMPILE_MODES, REGIONAL_COMPILE, REGIONAL_CUDAGRAPH_ERROR, SCOPES,
                      RecipeError)
from ._state import applied, modules, record

# The blog's four inductor settings, and the two it added for int8 dynamic quantization.
INDUCTOR_FLAGS = {"conv_1x1_as_mm": True, "coordinate_descent_tuning": True,
                  "epilogue_fusion": False, "coordinate_descent_check_all_directions": True}
QUANT_INDUCTOR_FLAGS = {"force_fuse_int_mm_with_mul": True, "use_mixed_mm": True}

# Blocks compiled by regional compile. diffusers declares only BasicTransformerBlock for the
# UNet (its ResNet blocks would stay eager) and nothing for PixArt (compile_repeated_blocks
# raises), so the helper declares both before calling diffusers' compile_repeated_blocks.
REGIONAL_BLOCKS = {"unet": ["BasicTransformerBlock", "ResnetBlock2D"],
                   "transformer": ["BasicTransformerBlock"]}


def set_inductor_flags(quantizing: bool = False) -> dict[str, Any]:
    """Set the blog's inductor flags (process-wide); the quantization pair only where this
    torch still has them. Returns what was set."""
    import torch._inductor.config as inductor_config

    flags = dict(INDUCTOR_FLAGS, **(QUANT_INDUCTOR_FLAGS if quantizing else {}))
    done = {}
    for name, value in flags.items():
        if hasattr(inductor_config, name):
            setattr(inductor_config, name, value)
            done[name] = value
    return done


def set_channels_last(pipe):
    """NHWC memory format for the denoiser and VAE convolutions."""
    for module in modules(pipe):
        module.to(memory_format=torch.channels_last)
    record(pipe, "channels_last", True)
    return pipe


def compile_pipeline(pipe, mode: str = "max-autotune", scope: str = "full",
                     compile_vae: bool = True, fullgraph: bool = False,
                     dynamic: bool | None = None, inductor_flags: bool = False):
    """Compile the denoiser (whole, or its repeated blocks) and, optionally, the VAE decode.

    Compilation happens lazily at the first call: that call is the cold start."""
    if mode not in COMPILE_MODES or mode is None:
        raise RecipeError(f"Unknown compile mode {mode!r}. Use one of: "
                          f"{', '.join(m for m in COMPILE_MODES if m)}.")
    if scope not in SCOPES:
        raise RecipeError(f"Unknown compile scope {scope!r}. Use 'full' or 'regional'.")
    if scope == "regional" and mode in REGIONAL_COMPILE and pipeline_device(pipe).type == "cuda":
        raise RecipeError(REGIONAL_CUDAGRAPH_ERROR.format(mode=mode, fix=REGIONAL_COMPILE[mode]))
    if "compile" in applied(pipe):
        raise RecipeError("This pipeline is already compiled; load a fresh pipeline to compile "
                          "it another way.")
    if inductor_flags:
        record(pipe, "inductor_flags", set_inductor_flags("quantize" in applied(pipe)))
    kwargs = dict(mode=mode, fullgraph=fullgraph, dynamic=dynamic)
    denoiser = get_denoiser(pipe)
    if scope == "full":
        denoiser.compile(**kwargs)
    else:
        denoiser._repeated_blocks = REGIONAL_BLOCKS["unet" if hasattr(pipe, "unet") else
                                                    "transformer"]
        denoiser.compile_repeated_blocks(**kwargs)
    if compile_vae:
        pipe.vae.decode = torch.compile(pipe.vae.decode, **kwargs)
    record(pipe, "compile", dict(kwargs, scope=scope, compile_vae=compile_vae))
    return pipe


def capture_denoiser_inputs(pipe, **kwargs) -> tuple[tuple, dict]:
    """The (args, kwargs) the pipeline passes to its denoiser, from a real short call."""
    denoiser = get_denoiser(pipe)
    seen: list[tuple[tuple, dict]] = []

    def hook(module, args, kw):
        if not seen:
            seen.append((args, dict(kw)))

    compiled, denoiser._compiled_call_impl = denoiser._compiled_call_impl, None
    handle = denoiser.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        call = call_kwargs(pipe, **dict(dict(steps=2), **kwargs))  # PixArt special-cases 1 step
        call["output_type"] = "latent"
        pipe(**call)
    finally:
        handle.remove()
        denoiser._compiled_call_impl = compiled
    return seen[0]


def graph_breaks(pipe, verbose: bool = True, **kwargs) -> dict[str, Any]:
    """Dynamo's graph-break report for the denoiser, with the inputs the pipeline really passes.

    Returns {"graphs", "graph_breaks", "reasons", "ops"}; zero breaks means fullgraph=True
    compiles. Leaves every other compiled model of the process alone: torch._dynamo.explain()
    calls torch._dynamo.reset() before and after (torch/_dynamo/eval_frame.py, explain()),
    which throws away all compiled code, so this traces with dynamo's ExplainWithBackend
    (torch/_dynamo/backends/debugging.py) and then drops only its own cache entries.
    Introduced in 04_torch_compile.ipynb."""
    from torch._dynamo.backends.debugging import ExplainWithBackend
    from torch._dynamo.eval_frame import remove_from_cache

    args, kw = capture_denoiser_inputs(pipe, **kwargs)
    forward = get_denoiser(pipe).forward

    def traced(*a, **k):  # a code object of our own: the cache entries dropped below
        return forward(*a, **k)

    explainer = ExplainWithBackend("eager")
    try:
        with torch.no_grad():
            torch.compile(traced, backend=explainer)(*args, **kw)
    finally:
        remove_from_cache(traced)
    explained = explainer.output()
    reasons = [str(getattr(r, "reason", r)) for r in explained.break_reasons]
    report = {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
              "reasons": reasons, "ops": explained.op_count}
    if verbose:
        print(f"{report['graphs']} graph(s), {report['graph_breaks']} graph break(s), "
              f"{report['ops']} ops" + "".join(f"\n  - {r}" for r in reasons))
    return report
