"""The records that describe a model of the course: Component (one part built in code) and
ModelSpec (everything the helpers need to know about one model).

Introduced in 00_setup.ipynb (through fdh.MODELS). Pure data, like presets.py and flux.py,
which hold the models themselves: imports nothing of the package and no heavy library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Component:
    """One pipeline component built in code: its class and constructor config."""

    library: str  # "diffusers" or "transformers"
    class_name: str
    config: dict[str, Any]
    config_class: str | None = None  # transformers config class, e.g. "CLIPTextConfig"


@dataclass(frozen=True)
class ModelSpec:
    """Everything the helpers need to know about one model of the course."""

    key: str
    name: str
    hub_id: str
    pipeline_class: str
    # The family, stated here once; every helper reads it (spec.family, loading.family_of):
    # "unet" (SD1.5, SDXL, SSD-1B), "transformer" (PixArt-alpha's DiT) or "flux" (Flux.1's
    # double- and single-stream blocks). tests/test_layout.py bans deciding it any other way.
    family: str
    resolution: int
    steps: int
    guidance: float
    tokenizers: dict[str, str]  # attribute -> "clip" | "t5"
    max_tokens: int  # tokens per prompt fed to the denoiser's cross-attention (T5's, for Flux)
    scheduler: Component
    full: dict[str, Component]
    tiny: dict[str, Component]
    tiny_resolution: int = 64
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)
    # passed on every pipe() call by the helpers: PixArt's resolution binning would resize
    # tiny images to 256 px, and its caption cleaning needs ftfy/bs4.
    call_kwargs: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    # The pipeline packs latent patches of this side into tokens: Flux's packs 2x2
    # (pipeline_flux.py:209-211, "the latent width and height has to be divisible by the
    # patch size"), a step its transformer's own patch_size (1) does not show.
    packing: int = 1
    # Classifier-free guidance as the pipeline runs it: a batch of 2 (unconditional and
    # conditional) when guidance > 1. False: guidance is an input of one call (FLUX.1-dev's
    # embedded guidance, pipeline_flux.py:847-851), or none (FLUX.1-schnell).
    cfg: bool = True
    # The ladders written for this model, the first its default (course/planning/ladders.py
    # LADDERS): the blog's and the course's for the four models the blog ran, "flux" for Flux.
    ladders: tuple[str, ...] = ("blog", "course")

    @property
    def denoiser(self) -> str:
        """The denoiser's attribute on the pipeline: "unet" for the UNet family, else
        "transformer"."""
        return "unet" if self.family == "unet" else "transformer"

    @property
    def size_multiple(self) -> int:
        """Image sizes this model can make are multiples of this: the VAE's downscale (8),
        times the patch the latent is cut into: PixArt's transformer patch (2), Flux's pipeline
        packing (2)."""
        patch = self.full[self.denoiser].config.get("patch_size") or 1
        return 8 * max(int(patch), self.packing)

    def resolution_for(self, weights: str) -> int:
        """The image size the course uses with these weights: the tiny models' own size, else
        the model's native resolution."""
        return self.tiny_resolution if weights == "tiny" else self.resolution
