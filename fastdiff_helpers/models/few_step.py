"""Few-step distilled weights for SDXL: where each lives on the hub, and the scheduler, steps
and guidance its authors run it with. Read from each model card (sources below); loaded by
fdh.use_few_step (techniques/schedulers.py) only where the file is already on this machine.

Introduced in 09_fewer_denoiser_calls.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .hub import cached


@dataclass(frozen=True)
class FewStep:
    repo: str
    filename: str
    scheduler: str  # a diffusers scheduler class, made from the pipeline's scheduler config
    scheduler_kwargs: dict[str, Any]
    steps: int
    guidance: float  # <= 1: no classifier-free guidance (the SDXL pipeline guides above 1)
    call_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def local_file(self) -> str | None:
        """The local path of these weights in the Hugging Face cache, or None (no network:
        hub.cached only looks). Introduced in 09_fewer_denoiser_calls.ipynb."""
        return cached(self.repo, self.filename)


FEW_STEP: dict[str, FewStep] = {
    "lcm-lora": FewStep(
        "latent-consistency/lcm-lora-sdxl", "pytorch_lora_weights.safetensors", "LCMScheduler",
        {}, 4, 1.0,
        source="latent-consistency/lcm-lora-sdxl model card: LCMScheduler, 2 to 8 steps, "
               "guidance disabled or between 1.0 and 2.0"),
    "sdxl-lightning": FewStep(
        "ByteDance/SDXL-Lightning", "sdxl_lightning_4step_lora.safetensors",
        "EulerDiscreteScheduler", {"timestep_spacing": "trailing"}, 4, 0.0,
        source="ByteDance/SDXL-Lightning model card: the N-step LoRA with N steps, Euler with "
               "trailing timesteps, guidance_scale=0"),
    "hyper-sd": FewStep(
        "ByteDance/Hyper-SD", "Hyper-SDXL-2steps-lora.safetensors", "DDIMScheduler",
        {"timestep_spacing": "trailing"}, 2, 0.0,
        source="ByteDance/Hyper-SD model card: DDIM with trailing timesteps, 2 steps, "
               "guidance_scale=0"),
    "tcd": FewStep(
        "h1t/TCD-SDXL-LoRA", "pytorch_lora_weights.safetensors", "TCDScheduler", {}, 4, 0.0,
        {"eta": 0.3},
        source="h1t TCD model cards and diffusers' TCD-LoRA guide: TCDScheduler, 4 steps, "
               "guidance_scale=0, eta (gamma) 0.3"),
}
