"""Fewer denoiser calls, the denoiser's side: a step cache (DeepCache-style for UNets, a block
cache for PixArt and Flux) and, for PixArt, guidance stopped after a share of the steps.

Introduced in 09_fewer_denoiser_calls.ipynb. Both run through one StepPlan, put in place of the
denoiser's forward: it counts the steps of each pipeline call and picks, per step, the full path
or the cached one (cache_paths.py). Its choice is plain Python outside any compiled code, so a
compiled pipeline compiles each path once (compile_pipeline compiles the plan's paths) and
never recompiles for the step, and nothing in it reads a tensor's value (no host sync).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..errors import FastdiffError
from ..models.loading import call_kwargs, family_of, get_denoiser, pipeline_info
from ._state import applied, record, refuse_after
from .cache_paths import PATHS
from .recipe import RecipeError

# inputs the paths do not take (ControlNet and adapter residuals, class labels, GLIGEN): a call
# that passes one is refused rather than silently run without it
UNSUPPORTED = ("class_labels", "down_block_additional_residuals",
               "mid_block_additional_residual", "down_intrablock_additional_residuals",
               "controlnet_block_samples", "controlnet_single_block_samples")
_SAMPLE = {"unet": "sample", "transformer": "hidden_states", "flux": "hidden_states"}


def cached_schedule(steps: int, every: int = 1, guided_steps: int | None = None
                    ) -> list[tuple[str, int]]:
    """(path, batch) of each step: "full" on every `every`-th step (and where the batch
    changes, since the kept features have the old batch), else "cached"; batch 2 while
    classifier-free guidance runs (the first `guided_steps`; None: all, 0: none), then 1.
    The plan follows it step by step (tested); count_flops counts from it."""
    guided = steps if guided_steps is None else guided_steps
    out: list[tuple[str, int]] = []
    for i in range(steps):
        batch = 2 if i < guided else 1
        full = every == 1 or i % every == 0 or (out and out[-1][1] != batch)
        out.append(("full" if full else "cached", batch))
    return out


def guided_steps(steps: int, share: float | None) -> int:
    """How many of `steps` run with guidance when it stops after `share` of them (rounded
    up: share 0.5 of 8 steps guides 4, of 7 guides 4)."""
    return steps if share is None else min(steps, max(1, math.ceil(steps * share - 1e-9)))


class StepPlan:
    """The denoiser's forward while a step cache or a PixArt guidance stop is on (see the
    module's docstring); `log` holds (step, path, batch) of the current or last pipeline call."""

    def __init__(self, pipe) -> None:
        self.pipe, self.denoiser = pipe, get_denoiser(pipe)
        self.kind = family_of(pipe)
        self.original = self.denoiser.forward
        self.signature = inspect.signature(self.original)
        self.every, self.branch, self.guidance_stop = 1, 1, None
        self.clone_feature = False
        self.log: list[tuple[int, str, int]] = []
        self._timesteps: Any = None
        self.feature: torch.Tensor | None = None
        self.build()

    def build(self) -> None:
        """(Re)make the two paths for the current `every` and `branch`."""
        denoiser, branch = self.denoiser, self.branch
        if self.every == 1:
            original = self.original

            def full(**kw):  # the library's own forward
                return original(**kw, return_dict=False)[0], None
            self.full, self.cached = full, None
            return
        full_path, cached_path, _ = PATHS[self.kind]

        def full(**kw):
            return full_path(denoiser, branch, **kw)

        def cached(feature, **kw):
            return cached_path(denoiser, branch, feature, **kw)
        self.full, self.cached = full, cached

    def compile(self, **kwargs: Any) -> None:
        """torch.compile each path with these arguments; CUDA-graph modes get the kept
        feature cloned out of the graph's output buffer, which the next replay overwrites
        (torch/_inductor/cudagraph_trees.py)."""
        self.full = torch.compile(self.full, **kwargs)
        if self.cached is not None:
            self.cached = torch.compile(self.cached, **kwargs)
        options = kwargs.get("options") or {}
        self.clone_feature = (kwargs.get("mode") in ("max-autotune", "reduce-overhead")
                              or bool(options.get("triton.cudagraphs")))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kw = dict(self.signature.bind(*args, **kwargs).arguments)
        return_dict = kw.pop("return_dict", True)
        for name in UNSUPPORTED:
            if kw.pop(name, None) is not None:
                raise FastdiffError(f"The step plan (fdh.step_cache / fdh.stop_guidance) does "
                                    f"not take {name}: load a fresh pipeline without them to "
                                    "use ControlNets or adapters.")
        if "ip_adapter_image_embeds" in (kw.get("joint_attention_kwargs") or {}):
            raise FastdiffError("The step plan (fdh.step_cache) does not take Flux's IP-Adapter "
                                "embeddings: load a fresh pipeline without them to use one.")
        timesteps = self.pipe.scheduler.timesteps
        if timesteps is not self._timesteps:  # set_timesteps makes a new tensor per call
            self._timesteps, self.feature, self.log = timesteps, None, []
        step, steps = len(self.log), len(timesteps)
        halve = (self.guidance_stop is not None
                 and step >= guided_steps(steps, self.guidance_stop))
        if halve:  # the conditional half of [uncond, cond]
            kw = _second_half(kw, kw[_SAMPLE[self.kind]].shape[0])
        batch = kw[_SAMPLE[self.kind]].shape[0]
        cached = (self.cached is not None and self.feature is not None and step % self.every != 0
                  and self.feature.shape[0] == batch)  # (a guidance stop halves the batch)
        if cached:
            out = self.cached(self.feature, **kw)
        else:  # the full path on every `every`-th step
            out, feature = self.full(**kw)
            if self.cached is not None:  # a CUDA graph would overwrite it: clone it out
                self.feature = feature.clone() if self.clone_feature else feature
        self.log.append((step, "cached" if cached else "full", batch))
        if halve:  # guidance then computes cond + g * (cond - cond) = cond
            out = torch.cat([out, out])
        if not return_dict:
            return (out,)
        from diffusers.models.modeling_outputs import Transformer2DModelOutput
        from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

        return (UNet2DConditionOutput if self.kind == "unet" else Transformer2DModelOutput)(out)


def _second_half(value: Any, batch: int) -> Any:
    if torch.is_tensor(value) and value.ndim and value.shape[0] == batch:
        return value.chunk(2)[1]
    if isinstance(value, dict):
        return {k: _second_half(v, batch) for k, v in value.items()}
    return value


def step_plan(pipe, create: bool = False) -> StepPlan | None:
    """The pipeline's StepPlan (made and put in place with `create`), or None."""
    info = pipeline_info(pipe)
    plan = info.step_plan
    if plan is None and create:
        denoiser = get_denoiser(pipe)
        if getattr(denoiser, "class_embedding", None) is not None or getattr(
                denoiser.config, "addition_embed_type", None) == "image_hint":
            raise RecipeError(f"{type(denoiser).__name__} with class or image-hint embeddings "
                              "is not one the step plan was written for.")
        plan = info.step_plan = StepPlan(pipe)
        denoiser.forward = plan
    return plan


def check_branch(pipe, branch: int) -> None:
    """Refuse, before any work, a branch this denoiser does not have."""
    kind = family_of(pipe)
    most = PATHS[kind][2](get_denoiser(pipe))
    if isinstance(branch, bool) or not isinstance(branch, int) or not 1 <= branch <= most:
        raise RecipeError(f"branch={branch!r}: this {kind} takes 1 to {most} (the levels or "
                          "blocks recomputed on every step; fewer: faster cached steps).")


def step_cache(pipe, every: int = 3, branch: int = 1):
    """Run the denoiser's deep part only on every `every`-th step; the other steps recompute
    the shallow branch (`branch` levels of a UNet at each end, or the first `branch` PixArt
    blocks, or Flux blocks: its double-stream ones, then its single-stream ones) around the
    deep features kept from the last full step. every=1 changes nothing.
    Apply before compile (fdh.apply orders it). Introduced in 09_fewer_denoiser_calls.ipynb."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise RecipeError(f"every={every!r}: give a whole number of steps, 1 or more (3: the "
                          "deep part runs on every third step).")
    refuse_after(pipe, "step_cache", "compile")
    check_branch(pipe, branch)
    if "step_cache" in applied(pipe):
        raise RecipeError("This pipeline already has a step cache; load a fresh one to change "
                          "it.")
    plan = step_plan(pipe, create=True)
    plan.every, plan.branch = every, branch
    plan.build()
    record(pipe, "step_cache", {"every": every, "branch": branch})
    return pipe


def compile_plan(pipe, **kwargs: Any) -> bool:
    """Compile the step plan's paths in place of the whole denoiser (compile_pipeline, scope
    "full"); False when the pipeline has no plan."""
    plan = step_plan(pipe)
    if plan is not None:
        plan.compile(**kwargs)
    return plan is not None


def plan_settings(pipe) -> dict[str, Any]:
    """{"every", "branch", "guidance_stop"} as applied (every 1: no cache; None: guidance on
    every step), for records and FLOP counts."""
    done = applied(pipe)
    cache = done.get("step_cache", {})
    return {"every": cache.get("every", 1), "branch": cache.get("branch", 1),
            "guidance_stop": done.get("guidance_stop")}


def trace_steps(pipe, **kwargs: Any) -> list[tuple[int, str, int]]:
    """(step, path, batch) of each denoiser call of one call (latent output): the batch as the
    denoiser's first layer sees it (conv_in, PixArt's pos_embed, Flux's x_embedder), the path
    "full" or "cached" (always "full" without a step cache). `kwargs` as fdh.call_kwargs takes them.
    The traced call runs eagerly (torch.compiler.set_stance("force_eager")), compiled or not:
    a hook added after compiling never fires inside compiled code (dynamo does not guard on
    module hooks: torch/_dynamo/config.py, skip_nnmodule_hook_guards = True), and the path and
    batch of each step are chosen outside it, so the eager call takes the same ones.
    Introduced in 09_fewer_denoiser_calls.ipynb."""
    name = {"unet": "conv_in", "flux": "x_embedder"}.get(family_of(pipe), "pos_embed")
    first = getattr(get_denoiser(pipe), name)
    batches: list[int] = []
    handle = first.register_forward_pre_hook(lambda m, args: batches.append(args[0].shape[0]))
    try:
        call = call_kwargs(pipe, **kwargs)
        call["output_type"] = "latent"
        with torch.compiler.set_stance("force_eager"):  # compiled code neither runs nor compiles
            pipe(**call)
    finally:
        handle.remove()
    if not batches:
        raise FastdiffError(f"trace_steps saw no call of the denoiser's first layer "
                            f"({type(first).__name__}): something runs the denoiser without its "
                            "module hooks. Trace a fresh pipeline with the same recipe.")
    plan = step_plan(pipe)
    paths = [p for _, p, _ in plan.log] if plan is not None else ["full"] * len(batches)
    return [(i, path, batch) for i, (path, batch) in enumerate(zip(paths, batches))]


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The step cache as code (fdh.to_code): the helper's call; no library has a step cache
    that compiles for these denoisers (09_fewer_denoiser_calls)."""
    return {"step_cache": ["# the course's own step cache: ~250 lines in "
                           "fastdiff_helpers/techniques/cache_paths.py and step_cache.py",
                           "import fastdiff_helpers as fdh",
                           f"fdh.step_cache(pipe, every={r.cache_every}, branch={r.cache_branch})"]}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """The step cache in place of the denoiser's forward (fdh.current_recipe)."""
    plan = vars(get_denoiser(pipe)).get("forward")
    if not isinstance(plan, StepPlan):
        return {"cache_every": 1, "cache_branch": 1}
    return {"cache_every": plan.every, "cache_branch": plan.branch}
