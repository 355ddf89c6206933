"""What a loaded pipeline is now, read off its modules rather than the helpers' records: a
denoiser compiled by hand (a notebook's plain `torch.compile` cell). fdh.current_recipe and the
course clock's recorder read it.
"""

from __future__ import annotations

from typing import Any

import torch


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
        for cell in getattr(call, "__closure__", None) or ():
            if hasattr(cell.cell_contents, "callback") and hasattr(cell.cell_contents,
                                                                   "fullgraph"):
                return cell.cell_contents
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
    mode = "default"
    for name in ("reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"):
        if all(config.get(k) == v for k, v in list_mode_options(name).items()):
            mode = name
    return {"mode": mode, "fullgraph": bool(ctx.fullgraph), "scope": scope, "config": config,
            "dynamic": getattr(ctx, "_dynamic", None),
            "blocks": {type(getattr(b, "_orig_mod", b)).__name__ for b in blocks}}
