"""GPU syncs: finding device-to-host synchronisations and removing them from the loop.

Introduced in 07_gpu_syncs.ipynb."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from ..models.loading import call_kwargs, get_denoiser, pipeline_device
from ._state import applied, record


def keep_scheduler_on_cpu(pipe) -> None:
    """Scheduler state on the CPU, starting at step 0: stepping never reads a GPU tensor.

    Needed where a scheduler indexes CPU tables with a GPU timestep (PNDM, every step); the
    begin index also spares a counting scheduler its first-step lookup on GPU timesteps."""
    scheduler = pipe.scheduler
    original = scheduler.set_timesteps

    def set_timesteps(*args, **kwargs):
        kwargs["device"] = "cpu"
        original(*args, **kwargs)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)

    scheduler.set_timesteps = set_timesteps


def upload_timestep_without_sync(denoiser) -> None:
    """Copy a CPU timestep to the denoiser's device with non_blocking=True (a blocking
    host-to-device copy waits for the GPU queue, which is a sync)."""

    def hook(module, args, kwargs):
        sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
        if len(args) > 1:
            t = args[1]
            if torch.is_tensor(t) and t.device != sample.device:
                args = (args[0], t.to(sample.device, non_blocking=True)) + tuple(args[2:])
        elif torch.is_tensor(kwargs.get("timestep")):
            t = kwargs["timestep"]
            if t.device != sample.device:
                kwargs["timestep"] = t.to(sample.device, non_blocking=True)
        return args, kwargs

    denoiser.register_forward_pre_hook(hook, with_kwargs=True)


def no_sync_plan(pipe) -> tuple[bool, str]:
    """(move the schedule to the CPU?, why), decided from the pipeline and scheduler classes
    as diffusers 0.42 runs them."""
    return schedule_moves(type(pipe).__name__, type(pipe.scheduler).__name__)


def schedule_moves(pipeline: str, scheduler: str) -> tuple[bool, str]:
    """no_sync_plan by the two class names (the course clock asks it of a model's own
    pipeline and scheduler: where nothing moves, no_sync changes no compiled graph)."""
    if pipeline.startswith("PixArt"):
        # pipeline_pixart_alpha.py:926-927 copies a CPU timestep to the GPU with a blocking
        # .to() before the denoiser (and any hook) sees it: a CPU schedule adds a sync a step.
        return False, (f"nothing to do: PixArt's pipeline copies a CPU timestep to the GPU "
                       f"with a blocking .to() each step, so a CPU schedule would add syncs; "
                       f"its {scheduler} already keeps sigmas on the CPU and the pipeline sets "
                       "the begin index")
    if scheduler == "FlowMatchEulerDiscreteScheduler" and pipeline == "FluxPipeline":
        # scheduling_flow_match_euler_discrete.py:372 puts the sigmas on the pipeline's device
        # and step() indexes them with its own counter (:508, :523); FluxPipeline sets the
        # begin index (pipeline_flux.py:888), so no step looks its index up on the host
        return False, ("nothing to do: Flux's FlowMatchEulerDiscreteScheduler keeps its sigmas "
                       "on the device and counts its step index, and FluxPipeline sets the "
                       "begin index")
    if scheduler in ("EulerDiscreteScheduler", "DPMSolverMultistepScheduler"):
        # scheduling_euler_discrete.py:481 / scheduling_dpmsolver_multistep.py:497 keep the
        # sigmas on the CPU, and both count their step index (diffusers PR 4347). Only the
        # first step may look it up, `(timesteps == t).nonzero()` on the GPU timesteps
        # (scheduling_dpmsolver_multistep.py:1165), where the pipeline sets no begin index:
        # SDXL's and PixArt's call set_begin_index(0) (pipeline_stable_diffusion_xl.py:1196),
        # SD1.5's StableDiffusionPipeline does not: one sync an image, none a step.
        return False, (f"nothing to do per step: diffusers' {scheduler} keeps its sigmas on "
                       "the CPU and counts its step index (a pipeline that sets no begin "
                       "index, SD1.5's, looks it up once, at the first step)")
    if scheduler == "PNDMScheduler":
        # scheduling_pndm.py:430-431: alphas_cumprod[timestep] and `prev_timestep >= 0` read
        # a GPU timestep on the host every step.
        return True, ("PNDMScheduler indexes its CPU alphas with the GPU timestep and compares "
                      "it on the host every step: schedule moved to the CPU, timestep uploaded "
                      "without blocking")
    return True, (f"{scheduler} not checked by the course: schedule moved to the CPU, timestep "
                  "uploaded without blocking (count_syncs shows whether it helps)")


def remove_syncs(pipe):
    """No device-to-host sync inside the denoising loop, where diffusers leaves one: decided
    per pipeline and scheduler (no_sync_plan; recorded in pipeline_info(pipe).applied
    ["no_sync"] and in benchmark notes). Math unchanged. Safe to call twice.
    Introduced in 07_gpu_syncs.ipynb."""
    if applied(pipe).get("no_sync"):
        return pipe
    move, why = no_sync_plan(pipe)
    if move:
        keep_scheduler_on_cpu(pipe)
        upload_timestep_without_sync(get_denoiser(pipe))
    record(pipe, "no_sync", {"scheduler": type(pipe.scheduler).__name__, "changed": move,
                             "why": why})
    return pipe


def count_syncs(pipe, verbose: bool = True, **kwargs) -> dict[str, Any] | None:
    """Count synchronising CUDA calls during one generation (torch.cuda sync debug mode):
    total, inside the denoising loop (from its start, step 0 included, to the last step's
    callback) and where they come from. On a CPU there is nothing to count: says so, returns
    None. The call's arguments are checked first, on any device.
    Introduced in 07_gpu_syncs.ipynb."""
    call = call_kwargs(pipe, **kwargs)
    if pipeline_device(pipe).type != "cuda":
        if verbose:
            print("count_syncs needs a CUDA GPU: a CPU has no device-to-host synchronisation "
                  "to count. Run this cell on a GPU machine.")
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start, marks = _loop_marks(pipe, call, caught)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pipe(**call)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            del pipe.progress_bar  # the class's method again
    syncs = [(i, w) for i, w in enumerate(caught) if "synchroniz" in str(w.message)]
    in_loop = sum(1 for i, _ in syncs if start and marks and start[0] <= i < marks[-1])
    where = sorted({f"{w.filename}:{w.lineno}" for _, w in syncs})
    report = {"total": len(syncs), "in_loop": in_loop, "per_step": in_loop / max(len(marks), 1),
              "where": where}
    if verbose:
        print(f"{report['total']} syncs in one image, {in_loop} inside the denoising loop "
              f"({report['per_step']:.2f} per step)" + "".join(f"\n  - {w}" for w in where))
    return report


def _loop_marks(pipe, call: dict, caught: list) -> tuple[list[int], list[int]]:
    """Where the denoising loop starts (the pipelines open their progress bar right before
    step 0) and where each step ends (callback_on_step_end; PixArt-alpha's pipeline has only
    the legacy `callback(step, timestep, latents)`, pipeline_pixart_alpha.py:708 and :961, and
    swallows an unknown callback_on_step_end in its **kwargs: there no step would be marked and
    every sync would count as outside the loop), as positions in `caught`."""
    start: list[int] = []
    marks: list[int] = []
    progress_bar = pipe.progress_bar

    def opening(*args, **kwargs):
        if not start:
            start.append(len(caught))
        return progress_bar(*args, **kwargs)

    pipe.progress_bar = opening
    if "callback_on_step_end" not in inspect.signature(pipe.__call__).parameters:
        call.update(callback=lambda i, t, latents: marks.append(len(caught)), callback_steps=1)
        return start, marks
    original = call.get("callback_on_step_end")  # a technique's own (fdh.stop_guidance)

    def on_step_end(p, i, t, cb_kwargs):
        marks.append(len(caught))
        return original(p, i, t, cb_kwargs) if original is not None else cb_kwargs

    call["callback_on_step_end"] = on_step_end
    if original is not None:  # the pipeline reads a PipelineCallback's inputs off the object
        call["callback_on_step_end_tensor_inputs"] = list(original.tensor_inputs)
    return start, marks


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """Sync removal as plain code (fdh.to_code): the plan and the two fixes, from their source."""
    return {"no_sync_plan": ["# sync removal: only where diffusers 0.42 leaves a sync in the loop",
                             schedule_moves, no_sync_plan],
            "no_sync": [keep_scheduler_on_cpu, upload_timestep_without_sync,
                        "move, why = no_sync_plan(pipe)", "print('no_sync:', why)",
                        "if move:", "    keep_scheduler_on_cpu(pipe)",
                        f"    upload_timestep_without_sync({D})"]}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """Whether the loop runs without its syncs (fdh.current_recipe): remove_syncs' record (where
    the plan found nothing to change, only it knows), else both of its changes in place."""
    moved = [getattr(vars(pipe.scheduler).get("set_timesteps"), "__qualname__", ""),
             *(getattr(h, "__qualname__", "")
               for h in get_denoiser(pipe)._forward_pre_hooks.values())]
    fixes = {f for f in ("keep_scheduler_on_cpu", "upload_timestep_without_sync")
             if any(name.startswith(f + ".") for name in moved)}
    if done.get("no_sync") or len(fixes) == 2:
        return {"no_sync": True}
    return {"no_sync": False if not fixes else f"{', '.join(fixes)} only"}
