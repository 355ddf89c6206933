"""GPU syncs: finding device-to-host synchronisations and removing them from the loop.

Introduced in 06_gpu_syncs.ipynb."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..loading import call_kwargs, get_denoiser, pipeline_device
from ._state import applied, record


def keep_scheduler_on_cpu(pipe) -> None:
    """Scheduler state on the CPU, starting at step 0: stepping never reads a GPU tensor.

    Without it the scheduler finds its first step with `(timesteps == t).nonzero().item()`
    on GPU tensors, and schedulers such as PNDM index CPU tables with GPU timesteps."""
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


def remove_syncs(pipe):
    """No device-to-host sync inside the denoising loop (see keep_scheduler_on_cpu and
    upload_timestep_without_sync). Math unchanged. Safe to call twice."""
    if applied(pipe).get("no_sync"):
        return pipe
    keep_scheduler_on_cpu(pipe)
    upload_timestep_without_sync(get_denoiser(pipe))
    record(pipe, "no_sync", True)
    return pipe


def count_syncs(pipe, verbose: bool = True, **kwargs) -> dict[str, Any] | None:
    """Count synchronising CUDA calls during one generation (torch.cuda sync debug mode):
    total, inside the denoising loop (between the first and last step's callbacks) and
    where they come from. On a CPU there is nothing to count: says so, returns None."""
    if pipeline_device(pipe).type != "cuda":
        if verbose:
            print("count_syncs needs a CUDA GPU: a CPU has no device-to-host synchronisation "
                  "to count. Run this cell on a GPU machine.")
        return None
    marks: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def on_step_end(p, i, t, cb_kwargs):
            marks.append(len(caught))
            return cb_kwargs

        call = call_kwargs(pipe, **kwargs)
        call["callback_on_step_end"] = on_step_end
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pipe(**call)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    in_loop = sum(1 for i, w in enumerate(caught) if "synchroniz" in str(w.message)
                  and marks and marks[0] <= i < marks[-1])
    steps = max(len(marks) - 1, 1)
    where = sorted({f"{w.filename}:{w.lineno}" for w in syncs})
    report = {"total": len(syncs), "in_loop": in_loop, "per_step": in_loop / steps,
              "where": where}
    if verbose:
        print(f"{report['total']} syncs in one image, {in_loop} inside the denoising loop "
              f"({report['per_step']:.2f} per step)" + "".join(f"\n  - {w}" for w in where))
    return report
