"""Fewer steps: another diffusers scheduler in place of the pipeline's own.

Introduced in 09_fewer_denoiser_calls.ipynb. The same swap as load_pipeline(scheduler=...), on a
pipeline already loaded: SchedulerClass.from_config(pipe.scheduler.config), the way the
diffusers docs swap schedulers (the new class keeps the training betas and timestep settings it
shares, and its own defaults for the rest)."""

from __future__ import annotations

from typing import Any

from ..errors import FastdiffError
from ..models.few_step import FEW_STEP
from ..models.loading import pipeline_info
from ..models.presets import SCHEDULERS


def set_scheduler(pipe, name: str):
    """Swap the scheduler: "dpm-solver" (DPM-Solver++ multistep), "unipc" or "euler" (see
    fdh.models.presets.SCHEDULERS). Every Result records the class that ran
    (Result.scheduler). Introduced in 09_fewer_denoiser_calls.ipynb."""
    if name not in SCHEDULERS:
        raise FastdiffError(f"Unknown scheduler {name!r}. Use one of: {', '.join(SCHEDULERS)}.")
    import diffusers

    pipe.scheduler = getattr(diffusers, SCHEDULERS[name]).from_config(pipe.scheduler.config)
    return pipe


def use_few_step(pipe, name: str, path: str | None = None) -> dict[str, Any]:
    """Few-step distilled weights on an SDXL pipeline (fdh.models.few_step.FEW_STEP: "lcm-lora",
    "sdxl-lightning", "hyper-sd", "tcd"): the LoRA loaded and fused into the UNet (diffusers'
    load_lora_weights, fuse_lora, unload_lora_weights: peft does the loading), the scheduler
    its authors use, and what else each call needs (TCD's eta) added to every call. `path`: a
    local .safetensors file; else the file in the Hugging Face cache (never downloaded here).
    Returns {"steps", "guidance"} to pass to fdh.benchmark. Introduced in
    09_fewer_denoiser_calls.ipynb."""
    if name not in FEW_STEP:
        raise FastdiffError(f"Unknown few-step weights {name!r}. Use one of: "
                            f"{', '.join(FEW_STEP)}.")
    spec = FEW_STEP[name]
    if pipeline_info(pipe).model != "sdxl":
        raise FastdiffError(f"{name} is a LoRA for SDXL; this pipeline is "
                            f"{pipeline_info(pipe).model}: load fdh.load_pipeline('sdxl').")
    path = path or spec.local_file()
    if path is None:
        raise FastdiffError(f"{spec.repo}/{spec.filename} is not on this machine: run `hf "
                            f"download {spec.repo} {spec.filename}` where there is network.")
    import diffusers

    pipe.load_lora_weights(path)
    pipe.fuse_lora()
    pipe.unload_lora_weights()  # the fused weights stay; no LoRA layers left to slow a call
    pipe.scheduler = getattr(diffusers, spec.scheduler).from_config(pipe.scheduler.config,
                                                                    **spec.scheduler_kwargs)
    if spec.call_kwargs:
        pipeline_info(pipe).per_call.append(lambda kwargs: dict(spec.call_kwargs))
    pipeline_info(pipe).applied["few_step"] = name
    return {"steps": spec.steps, "guidance": spec.guidance}
