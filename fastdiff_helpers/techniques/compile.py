"""torch.compile: modes, inductor flags, channels_last, regional compile, graph breaks.

Introduced in 04_torch_compile.ipynb."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..models.loading import (call_kwargs, family_of, get_denoiser, pipeline_device,
                              pipeline_info, pipeline_spec)
from ..models.hooks import tell
from ..models.noise import quiet_known_noise
from .flux import refuse
from ._state import agree, applied, consistent, parts, record
from ..models.state import compiled_by_hand
from .recipe import (ACCELERATE_COPIES, COMPILE_MODES, SCOPES, Recipe, RecipeError,
                     compile_mode_for)
from .step_cache import StepPlan, compile_plan, step_plan

# The blog's four inductor settings, and the one it added for int8 dynamic quantization, kept
# as the blog set it although torch 2.13 no longer acts on it (its one reader,
# check_shape_cuda_and_fused_int_mm_mul_enabled in torch/_inductor/fx_passes/post_grad.py, is
# registered with no pattern). diffusion-fast also set use_mixed_mm, which torch 2.13 ignores
# (torch/_inductor/config.py: "DEPRECATED. This setting is ignored."), so it is not set here.
INDUCTOR_FLAGS = {"conv_1x1_as_mm": True, "coordinate_descent_tuning": True,
                  "epilogue_fusion": False, "coordinate_descent_check_all_directions": True}
QUANT_INDUCTOR_FLAGS = {"force_fuse_int_mm_with_mul": True}

# compile_scope="regional-extended" (ours): the blocks compiled in place of diffusers' own
# _repeated_blocks, which declares only BasicTransformerBlock for the UNet (its ResNet blocks
# stay eager) and nothing for PixArt (compile_repeated_blocks raises there).
EXTENDED_BLOCKS = {"unet": ("BasicTransformerBlock", "ResnetBlock2D"),
                   "transformer": ("BasicTransformerBlock",)}


def blog_inductor_flags(quantizing: bool = False) -> dict[str, Any]:
    """The blog's inductor flags that this torch has, plus the int8 one when quantizing: what
    compile_pipeline(inductor_flags=True) passes, and fdh.to_code writes in its options= (13
    prints that code)."""
    import torch._inductor.config as inductor_config

    flags = dict(INDUCTOR_FLAGS, **(QUANT_INDUCTOR_FLAGS if quantizing else {}))
    return {name: value for name, value in flags.items() if hasattr(inductor_config, name)}


def set_channels_last(pipe):
    """NHWC memory format for the denoiser and VAE convolutions."""
    for module in parts(pipe).values():
        module.to(memory_format=torch.channels_last)
    record(pipe, "channels_last", True)
    return pipe


def check_scope(pipe, scope: str) -> None:
    """Refuse, before any work, a regional scope this pipeline's denoiser cannot take."""
    denoiser = get_denoiser(pipe)
    if scope == "regional-extended":
        refuse(pipe, "regional-extended")  # Flux: diffusers already declares both its blocks
    if scope == "regional" and not getattr(denoiser, "_repeated_blocks", None):
        raise RecipeError(f"diffusers declares no repeated blocks for {type(denoiser).__name__} "
                          "(compile_repeated_blocks would raise): use compile_scope="
                          "'regional-extended' or 'regional-accelerate'.")
    if scope == "regional-accelerate" and family_of(pipe) == "unet":
        # accelerate's compile_regions wraps leaf modules in torch.compile's OptimizedModule,
        # whose __len__ raises; the UNet's forward tests `if self.conv_norm_out:`, so the first
        # call fails ("GroupNorm does not support len()", diffusers 0.42 / accelerate 1.15)
        raise RecipeError("accelerate's compile_regions breaks diffusers' UNet (its forward "
                          "tests `if self.conv_norm_out:` on a wrapped GroupNorm): use "
                          "compile_scope='regional' or 'regional-extended' for UNet models.")


def compile_pipeline(pipe, mode: str = "max-autotune", scope: str = "full",
                     compile_vae: bool = True, fullgraph: bool = False,
                     dynamic: bool | None = None, inductor_flags: bool = False, *,
                     recipe: Recipe | None = None, tuning: Callable | None = None):
    """Compile the denoiser (whole, or its repeated blocks) and, optionally, the VAE decode.

    A CUDA-graph mode where the graphs cannot run (a CPU, or a regional scope) compiles without
    them and says so: the one policy for GPU-only choices (see fdh.Recipe). Otherwise it
    compiles what it is asked, as fdh.to_code writes it. `tuning`: a decision of your own, or
    the course's (fdh.course.settings(...).tuning), on whether a compile that would tune
    (max-autotune's search, the blog's coordinate descent) may: tuning(pipe, mode,
    inductor_flags, compile_vae, scope, recipe) returns the (mode, inductor_flags) to compile
    and the notes that say why, kept in the pipeline's record and its Results.
    `recipe`: the whole Recipe fdh.apply applies (what the decision and models/hooks.py's
    listeners are told). Compilation happens lazily at the first call: the cold start.
    Introduced in 08_int8_quantization.ipynb."""
    if mode not in COMPILE_MODES or mode is None:
        raise RecipeError(f"Unknown compile mode {mode!r}. Use one of: "
                          f"{', '.join(m for m in COMPILE_MODES if m)}.")
    if scope not in SCOPES:
        raise RecipeError(f"Unknown compile scope {scope!r}. Use one of: {', '.join(SCOPES)}.")
    for name, value in (("compile_vae", compile_vae), ("fullgraph", fullgraph),
                        ("inductor_flags", inductor_flags)):
        if not isinstance(value, bool):
            raise RecipeError(f"{name} must be True or False, not {value!r}.")
    if dynamic not in (None, True, False):
        raise RecipeError(f"dynamic must be None, True or False, not {dynamic!r}.")
    gpu_mode = compile_mode_for(mode, scope, "cuda")[0]  # what a CUDA GPU runs (the listeners)
    device = str(pipeline_device(pipe))
    mode, note = compile_mode_for(mode, scope, device)
    if "compile" in applied(pipe):
        raise RecipeError("This pipeline is already compiled; load a fresh pipeline to compile "
                          "it another way.")
    check_scope(pipe, scope)
    if scope == "regional-accelerate" and step_plan(pipe) is not None:
        raise RecipeError(ACCELERATE_COPIES)
    tell("compile", pipe=pipe, mode=mode, gpu_mode=gpu_mode, scope=scope,
         compile_vae=compile_vae, inductor_flags=inductor_flags, recipe=recipe)
    if note is not None:
        print(f"fastdiff: {note}")
    if tuning is not None:  # whether a compile that would tune may: decided above the core
        asked = (mode, inductor_flags)
        mode, inductor_flags, notes = tuning(pipe, mode, inductor_flags, compile_vae, scope,
                                             recipe.for_device(device)[0] if recipe else None)
        if notes:
            record(pipe, "autotune", {"asked": list(asked), "notes": notes})
            pipeline_info(pipe).notes.extend(notes)  # the Results say them
    quiet_known_noise()
    how: dict[str, Any] = {"mode": mode}
    if inductor_flags:
        # passed per compile as config patches, never set process-wide (diffusion-fast set them
        # in torch._inductor.config, where they stay for every later compile: issue 23, item 9):
        # a later compile without them (another recipe, the playground) runs without them, as
        # its record says. torch.compile refuses mode= and options= together (torch/__init__.py,
        # compile), so options= holds what mode= sets (torch._inductor.list_mode_options) first.
        # The int8 flag (force_fuse_int_mm_with_mul) named torch._int_mm only: not for fp8
        from torch._inductor import list_mode_options

        flags = blog_inductor_flags(applied(pipe).get("quantize", {}).get("kind", "")
                                    .startswith("int8"))
        record(pipe, "inductor_flags", flags)
        how = {"options": dict(list_mode_options(mode), **flags)}
    kwargs = dict(how, fullgraph=fullgraph, dynamic=dynamic)
    if dynamic:
        # the diffusers guide's dynamic-shape compile: without duck sizing, two sizes that
        # happen to be equal (height == width) are not assumed equal forever
        import torch.fx.experimental._config as fx_config

        fx_config.use_duck_shape = False
        record(pipe, "use_duck_shape", False)
    denoiser = get_denoiser(pipe)
    if scope == "full":
        if not compile_plan(pipe, **kwargs):  # a step plan: its paths, each compiled once
            denoiser.compile(**kwargs)
    elif scope == "regional":
        denoiser.compile_repeated_blocks(**kwargs)
    elif scope == "regional-extended":  # in place: diffusers offers no way to extend its blocks
        names = EXTENDED_BLOCKS[family_of(pipe)]
        blocks = [m for m in denoiser.modules() if type(m).__name__ in names]
        if not blocks:
            raise RecipeError(f"No {', '.join(names)} in {type(denoiser).__name__}: nothing to "
                              "compile regionally; use compile_scope='full'.")
        for block in blocks:
            block.compile(**kwargs)
    else:
        from accelerate.utils import compile_regions

        setattr(pipe, pipeline_spec(pipe).denoiser, compile_regions(denoiser, **kwargs))
    if compile_vae:
        pipe.vae.decode = torch.compile(pipe.vae.decode, **kwargs)
    record(pipe, "compile", dict(mode=mode, fullgraph=fullgraph, dynamic=dynamic, scope=scope,
                                 compile_vae=compile_vae))
    return pipe


def capture_denoiser_inputs(pipe, **kwargs) -> tuple[tuple, dict]:
    """The (args, kwargs) the pipeline passes to its denoiser, from a real short call.
    Introduced in 04_torch_compile.ipynb."""
    seen: list[tuple[tuple, dict]] = []

    def hook(module, args, kw):
        if not seen:
            seen.append((args, dict(kw)))

    handle = get_denoiser(pipe).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        call = call_kwargs(pipe, **dict(dict(steps=2), **kwargs))  # PixArt special-cases 1 step
        call["output_type"] = "latent"
        with torch.compiler.set_stance("force_eager"):  # compiled code neither runs nor recompiles
            pipe(**call)
    finally:
        handle.remove()
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
    tell("trace", pipe=pipe)  # a trace, not a compile (models/hooks.py)
    try:
        with torch.no_grad():
            torch.compile(traced, backend=explainer)(*args, **kw)
    finally:
        remove_from_cache(traced)
        tell("trace_end", pipe=pipe)
    explained = explainer.output()
    reasons = [str(getattr(r, "reason", r)) for r in explained.break_reasons]
    report = {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
              "reasons": reasons, "ops": explained.op_count}
    if verbose:
        print(f"{report['graphs']} graph(s), {report['graph_breaks']} graph break(s), "
              f"{report['ops']} ops" + "".join(f"\n  - {r}" for r in reasons))
    return report


def channels_last_code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    return {"channels_last": [f"{D}.to(memory_format=torch.channels_last)",
                              "pipe.vae.to(memory_format=torch.channels_last)"]}


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The compile as plain code (fdh.to_code): torch.compile's own calls, the blog's flags as
    options= of these compiles only."""
    how = f"mode={r.compile!r}"
    lines = []
    if r.inductor_flags:
        flags = blog_inductor_flags(bool(r.quantize) and r.quantize.startswith("int8"))
        lines += ["# the blog's inductor flags, for these compiles only (diffusion-fast set "
                  "them process-wide",
                  "# in torch._inductor.config); options= carries the mode's own settings "
                  "too",
                  "from torch._inductor import list_mode_options",
                  f"options = {{**list_mode_options({r.compile!r}),"]
        lines += [f"           {k!r}: {v}," for k, v in flags.items()]
        lines[-1] = lines[-1].rstrip(",") + "}"
        how = "options=options"
    args = ", ".join([how] + (["fullgraph=True"] if r.fullgraph else [])
                     + ([f"dynamic={r.dynamic}"] if r.dynamic is not None else []))
    if r.dynamic:
        lines += ["import torch.fx.experimental._config as fx_config  # the guide's switch "
                  "(process-wide)",
                  "fx_config.use_duck_shape = False"]
    if r.compile_scope == "full" and (r.cache_every > 1 or r.guidance_stop is not None):
        # as compile_pipeline does it (measured, the whole denoiser: 8 frames for 8 steps, not 2)
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
        lines += ["# diffusers' own blocks plus the ones it leaves eager",
                  f"blocks = {EXTENDED_BLOCKS['unet']!r} if hasattr(pipe, 'unet') else "
                  f"{EXTENDED_BLOCKS['transformer']!r}",
                  f"for block in [m for m in {D}.modules() if type(m).__name__ in "
                  "blocks]:", f"    block.compile({args})"]
    else:
        name = "unet' if hasattr(pipe, 'unet') else 'transformer"
        lines += ["from accelerate.utils import compile_regions",
                  f"setattr(pipe, '{name}', compile_regions({D}, {args}))"]
    if r.compile_vae:
        lines.append(f"pipe.vae.decode = torch.compile(pipe.vae.decode, {args})")
    return {"compile": lines}


def channels_last_read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """Whether every 4-D weight of each part is in channels_last (fdh.current_recipe); a weight
    whose layout both formats describe (a 1x1 kernel) tells nothing."""
    found = {}
    for part, module in parts(pipe).items():
        told = []
        for p in module.parameters():
            if p.dim() == 4:
                last, plain = p.is_contiguous(memory_format=torch.channels_last), p.is_contiguous()
                told.append({True} if last and not plain else {False} if plain and not last
                            else {True, False})
        found[part] = consistent(told)
    return {"channels_last": agree(found, (False, True), bool(done.get("channels_last")))}


def _compiled(function) -> dict[str, Any] | None:
    return (compiled_by_hand(function) if hasattr(function, "_torchdynamo_orig_callable")
            else None)


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """How the denoiser and the VAE decode are compiled (fdh.current_recipe), read off dynamo's
    and inductor's wrappers: a module compiled whole or in place, its blocks (diffusers'
    repeated blocks: "regional"; with the ones it leaves eager: "regional-extended"; a copy
    with compiled children: accelerate's compile_regions), a step plan's paths, the decode; the
    mode whose options inductor's config holds, the blog's flags among them, and `dynamic`."""
    defaults = {k: Recipe.__dataclass_fields__[k].default for k in (
        "compile", "compile_scope", "compile_vae", "fullgraph", "dynamic", "inductor_flags")}
    done = done.get("compile")
    denoiser = get_denoiser(pipe)
    found = compiled_by_hand(denoiser)
    plan = vars(denoiser).get("forward")  # a step plan: compile_pipeline compiles its paths
    if found is None and isinstance(plan, StepPlan):
        found = _compiled(plan.full)
    vae = _compiled(pipe.vae.decode)
    if found is None and vae is None:
        return defaults
    first = found or vae
    scope = first["scope"]
    if found is not None and scope == "regional":
        repeated = set(getattr(denoiser, "_repeated_blocks", None) or ())
        scope = ("regional-accelerate" if "_orig_mod" in vars(denoiser) else
                 "regional" if found["blocks"] <= repeated else "regional-extended")
    modes = {"denoiser": {found["mode"] if found else None}, **({"vae": {vae["mode"]}} if vae else {})}
    flags = blog_inductor_flags()
    tuned = all(first["config"].get(k) == v for k, v in flags.items())
    return {"compile": agree(modes, COMPILE_MODES),
            "compile_scope": done["scope"] if done else scope,
            "compile_vae": vae is not None, "fullgraph": first["fullgraph"],
            "dynamic": first["dynamic"],
            "inductor_flags": tuned and bool(flags)}
