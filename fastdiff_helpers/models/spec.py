"""The records that describe a model of the course (Component, ModelSpec), and the VAE layout
and the text encoders more than one model uses.

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


def autoencoder(channels=(128, 256, 512, 512), groups: int = 32, layers: int = 2,
                latent: int = 4, **config: Any) -> Component:
    """An AutoencoderKL of SD's layout, a down and an up block per width of `channels`, with the
    model's own `config` after it (presets.py's VAEs, flux.py's)."""
    return Component("diffusers", "AutoencoderKL", dict(
        in_channels=3, out_channels=3, latent_channels=latent, layers_per_block=layers,
        block_out_channels=list(channels), norm_num_groups=groups,
        down_block_types=["DownEncoderBlock2D"] * len(channels),
        up_block_types=["UpDecoderBlock2D"] * len(channels), **config))


# The text encoders more than one model uses, full-size and tiny: CLIP ViT-L/14's text tower
# (openai/clip-vit-large-patch14: SD1.5's, SDXL's first encoder, Flux's, which reads its pooled
# output only) and T5 v1.1 XXL's encoder (google/t5-v1_1-xxl: PixArt-alpha's and Flux's).
def clip(hidden: int, inter: int, layers: int, heads: int, act: str, proj: int,
         vocab: int = 49408, projection: bool = False) -> Component:
    return Component(
        "transformers", "CLIPTextModelWithProjection" if projection else "CLIPTextModel",
        dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
             num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=77,
             hidden_act=act, projection_dim=proj, bos_token_id=0, eos_token_id=1,
             pad_token_id=1),
        config_class="CLIPTextConfig")


def _t5(d_model: int, d_kv: int, d_ff: int, layers: int, heads: int, vocab: int,
        buckets: int) -> Component:
    return Component("transformers", "T5EncoderModel", dict(
        vocab_size=vocab, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
        num_heads=heads, feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=buckets), config_class="T5Config")


CLIP_L = clip(768, 3072, 12, 12, "quick_gelu", 768)
TINY_CLIP = clip(32, 37, 2, 4, "quick_gelu", 32, vocab=1000)
T5_XXL = _t5(4096, 64, 10240, 24, 64, 32128, 32)
TINY_T5 = _t5(32, 8, 37, 2, 4, 1000, 8)
