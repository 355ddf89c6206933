"""A pipeline's state: the helpers' typed record of it (PipelineState), and what it is now read
off its modules rather than that record (compiled_by_hand).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .spec import ModelSpec


@dataclass(eq=False, repr=False)
class PipelineState:
    """The helpers' record of one pipeline, kept on it (fdh.pipeline_info(pipe)): what it was
    loaded as, and what the techniques did to it. load_pipeline makes it; a pipeline of the
    course's families loaded another way gets one on first use (loading.pipeline_info)."""

    spec: ModelSpec  # the model it was loaded (or is described) as; .model is its key
    weights: str  # "pretrained", "random", "tiny", or "user" (your own components)
    dtype: str  # the denoiser's, as loaded ("torch.bfloat16")
    device: str
    vae: str  # where the VAE came from: a hub id, or "pipeline" (its own)
    # what each technique did, by name (the helpers' functions record it; current_recipe,
    # the Results and the refusals read it)
    applied: dict[str, Any] = field(default_factory=dict)
    recipe: Any = None  # the Recipe fdh.apply ran (after the one policy), or None
    requested: Any = None  # the Recipe fdh.apply was given
    notes: list[str] = field(default_factory=list)  # said of this pipeline; Results carry them
    # arguments a technique adds to every call, made from the call's own (fdh.stop_guidance)
    per_call: list[Callable[[dict], dict]] = field(default_factory=list)
    step_plan: Any = None  # the step cache's StepPlan, made on first use (techniques/step_cache)
    attention_pinned: dict[str, int] | None = None  # forced SDPA kernels: attentions per module

    @property
    def model(self) -> str:
        return self.spec.key

    def __repr__(self) -> str:
        said = ", ".join(f"{k}={getattr(self, k)!r}"
                         for k in ("model", "weights", "dtype", "device", "vae", "applied"))
        return f"PipelineState({said}{f', recipe={self.recipe!r}' if self.recipe else ''})"


def compiled_by_hand(module: torch.nn.Module) -> dict[str, Any] | None:
    """How `module` was compiled outside the helpers, or None: {"mode", "fullgraph", "scope"}
    for `torch.compile(module, ...)` (an OptimizedModule), `module.compile(...)` ("full") or
    blocks compiled in place, as `compile_repeated_blocks` does ("regional"). The mode is read
    off inductor's wrapper: the mode whose options (torch._inductor.list_mode_options) its
    config holds. A notebook's plain `torch.compile` cell is read this way (fdh.current_recipe,
    and the course clock's kind of call)."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._inductor import list_mode_options

    def context(target):
        if isinstance(target, OptimizedModule):
            return target.dynamo_ctx
        # a module compiled in place keeps its compiled call; a function torch.compile wrapped
        # (pipe.vae.decode, a step plan's path) is that call itself
        call = getattr(target, "_compiled_call_impl", None) or (
            target if hasattr(target, "_torchdynamo_orig_callable") else None)
        for contents in (cell.cell_contents for cell in getattr(call, "__closure__", None) or ()):
            if hasattr(contents, "callback") and hasattr(contents, "fullgraph"):
                return contents
        return None

    scope, ctx, blocks = "full", context(module), []
    if ctx is None:
        blocks = [m for m in module.modules() if m is not module and context(m) is not None]
        if not blocks:
            return None
        scope, ctx = "regional", context(blocks[0])
    backend, depth = ctx.callback, 0
    while backend is not None and not hasattr(backend, "apply_mode") and depth < 8:
        backend, depth = getattr(backend, "_torchdynamo_orig_backend", None), depth + 1
    config = getattr(backend, "config", {}) or {}
    mode = next((name for name in ("max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
                 if all(config.get(k) == v for k, v in list_mode_options(name).items())), "default")
    return {"mode": mode, "fullgraph": bool(ctx.fullgraph), "scope": scope, "config": config,
            "dynamic": getattr(ctx, "_dynamic", None),
            "blocks": {type(getattr(b, "_orig_mod", b)).__name__ for b in blocks}}
