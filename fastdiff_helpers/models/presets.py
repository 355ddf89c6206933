"""The models of the course: hub ids, pipeline classes, full-size and tiny configs; the four
the blog ran here, Flux.1 in flux.py.

Introduced in 00_setup.ipynb. Pure data: this module imports nothing of the package but its
error class and the other data modules (spec.py, flux.py), and no heavy library, so
`fdh.MODELS` can be read without loading torch or diffusers.

The full-size configs reproduce the published architectures, so `weights="random"` has the
real parameter counts, FLOPs, speed and memory (checked against the course's PUBLISHED_PARAMETERS,
course/planning/published.py, in tests/test_loading.py). The tiny configs keep every class and code
path but shrink widths and depths so a 64x64 image takes about a second on a CPU.
"""

from __future__ import annotations

from typing import Any

from ..errors import FastdiffError
from .flux import FLUX_MODELS
from .spec import CLIP_L, T5_XXL, TINY_CLIP, TINY_T5, Component, ModelSpec, autoencoder, clip


# The prompt every helper uses when none is given.
DEFAULT_PROMPT = "a photo of an astronaut riding a horse on mars"


# --- shared building blocks -------------------------------------------------------------

_SD_SCHEDULER_KW = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                        num_train_timesteps=1000, steps_offset=1)
_EULER = Component("diffusers", "EulerDiscreteScheduler",
                   dict(_SD_SCHEDULER_KW, timestep_spacing="leading", prediction_type="epsilon"))


def _sdxl_unet(**over: Any) -> Component:
    cfg = dict(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=[320, 640, 1280],
        down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        transformer_layers_per_block=[1, 2, 10], attention_head_dim=[5, 10, 20],
        cross_attention_dim=2048, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)
    cfg.update(over)
    return Component("diffusers", "UNet2DConditionModel", cfg)


def _tiny_sdxl_unet(**over: Any) -> Component:
    # cross_attention_dim = 32 + 32 (both tiny text encoders); the added embedding takes
    # 6 time ids of addition_time_embed_dim plus text_encoder_2's 32-wide pooled output.
    return _sdxl_unet(
        sample_size=8, block_out_channels=[32, 64], layers_per_block=1, norm_num_groups=8,
        down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"],
        transformer_layers_per_block=[1, 2], attention_head_dim=[2, 4],
        cross_attention_dim=64, addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32, **over)


def _pixart(sample: int, layers: int, heads: int, dim: int, cross: int, caption: int) -> Component:
    return Component("diffusers", "PixArtTransformer2DModel", dict(
        sample_size=sample, num_layers=layers, num_attention_heads=heads,
        attention_head_dim=dim, in_channels=4, out_channels=8, patch_size=2,
        cross_attention_dim=cross, caption_channels=caption, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6))


_CLIP_BIGG = clip(1280, 5120, 32, 20, "gelu", 1280, projection=True)
_TINY_CLIP_PROJ = clip(32, 37, 2, 4, "gelu", 32, vocab=1000, projection=True)
_TINY_VAE = autoencoder((8, 16, 16, 16), 4, sample_size=64, scaling_factor=0.18215,
                        force_upcast=False)

_SDXL_VAE = autoencoder(sample_size=1024, scaling_factor=0.13025, force_upcast=True)
_SD_VAE = autoencoder(sample_size=512, scaling_factor=0.18215, force_upcast=False)

# Other components a ladder may load in place of a pipeline's own (load_pipeline(vae=...,
# scheduler=...)). The fp16-fix VAE is SDXL's VAE fine-tuned to stay finite in fp16; its config
# (madebyollin/sdxl-vae-fp16-fix, config.json) is SDXL's with sample_size 512 and no forced
# upcast. The tiny one is the tiny VAE with the same two settings.
FP16_FIX_VAE_ID = "madebyollin/sdxl-vae-fp16-fix"
VAES: dict[str, tuple[str, Component, Component]] = {
    "fp16-fix": (FP16_FIX_VAE_ID,
                 autoencoder(sample_size=512, scaling_factor=0.13025, force_upcast=False),
                 autoencoder((8, 16, 16, 16), 4, sample_size=64, scaling_factor=0.13025,
                             force_upcast=False)),
}
# "dpm-solver" is DPM-Solver++ (the class's default algorithm_type "dpmsolver++"), as
# diffusion-fast ran SD1.5; "unipc" and "euler" are the other swaps of 09_fewer_denoiser_calls.
SCHEDULERS: dict[str, str] = {"dpm-solver": "DPMSolverMultistepScheduler",
                              "unipc": "UniPCMultistepScheduler",
                              "euler": "EulerDiscreteScheduler"}


# The weight files each course repository holds (its file list on the hub): the dtype of its
# plain files, and whether it also has *.fp16.safetensors, which from_pretrained(variant=
# "fp16") fetches folder by folder, the plain files where a folder has none
# (diffusers/pipelines/pipeline_loading_utils.py variant_compatible_siblings). Read from
# huggingface.co/<id>/tree/main: SDXL unet/ 5.14 GB fp16 beside 10.3 GB, vae/ 167 MB beside 335
# MB; SD1.5 unet/ 1.72 GB beside 3.44 GB; SSD-1B vae/ 167 MB beside 335 MB (its other folders
# not read: the model card loads it with variant="fp16"); PixArt transformer/ 2.45 GB and
# text_encoder/ 9.99 + 9.06 GB, plain files only; fp16-fix: one fp32 file per format, no
# variant (main's listing not read: third-party copies of its file are 335 MB); Flux: bf16
# files only (33.7 GB for 16.9e9 parameters). Where a repo differs, the loader goes by the
# hub's own file list (models/downloads.py).
HUB_FILES: dict[str, tuple[str, bool]] = {
    "stabilityai/stable-diffusion-xl-base-1.0": ("fp32", True),
    "stable-diffusion-v1-5/stable-diffusion-v1-5": ("fp32", True),
    "segmind/SSD-1B": ("fp32", True),
    "PixArt-alpha/PixArt-XL-2-1024-MS": ("fp32", False),
    FP16_FIX_VAE_ID: ("fp32", False),
    "black-forest-labs/FLUX.1-dev": ("bf16", False),
    "black-forest-labs/FLUX.1-schnell": ("bf16", False),
}


# --- the models ---------------------------------------------------------------------

MODELS: dict[str, ModelSpec] = {
    "sdxl": ModelSpec(
        key="sdxl", name="Stable Diffusion XL 1.0 (base)",
        hub_id="stabilityai/stable-diffusion-xl-base-1.0",
        pipeline_class="StableDiffusionXLPipeline", family="unet",
        resolution=1024, steps=30, guidance=5.0,
        tokenizers={"tokenizer": "clip", "tokenizer_2": "clip"}, max_tokens=77,
        scheduler=_EULER,
        full={"unet": _sdxl_unet(), "vae": _SDXL_VAE, "text_encoder": CLIP_L,
              "text_encoder_2": _CLIP_BIGG},
        tiny={"unet": _tiny_sdxl_unet(), "vae": _TINY_VAE, "text_encoder": TINY_CLIP,
              "text_encoder_2": _TINY_CLIP_PROJ},
        pipeline_kwargs={"add_watermarker": False},
    ),
    "sd15": ModelSpec(
        key="sd15", name="Stable Diffusion 1.5",
        hub_id="stable-diffusion-v1-5/stable-diffusion-v1-5",
        pipeline_class="StableDiffusionPipeline", family="unet",
        resolution=512, steps=30, guidance=7.5,
        tokenizers={"tokenizer": "clip"}, max_tokens=77,
        scheduler=Component("diffusers", "PNDMScheduler", dict(
            _SD_SCHEDULER_KW, skip_prk_steps=True, set_alpha_to_one=False)),
        full={"unet": Component("diffusers", "UNet2DConditionModel", dict(
                  sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                  block_out_channels=[320, 640, 1280, 1280], cross_attention_dim=768,
                  attention_head_dim=8, down_block_types=["CrossAttnDownBlock2D"] * 3
                  + ["DownBlock2D"], up_block_types=["UpBlock2D"]
                  + ["CrossAttnUpBlock2D"] * 3)),
              "vae": _SD_VAE, "text_encoder": CLIP_L},
        tiny={"unet": Component("diffusers", "UNet2DConditionModel", dict(
                  sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                  block_out_channels=[32, 64], cross_attention_dim=32, norm_num_groups=8,
                  attention_head_dim=4,
                  down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                  up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"])),
              "vae": _TINY_VAE, "text_encoder": TINY_CLIP},
        pipeline_kwargs={"safety_checker": None, "feature_extractor": None,
                         "requires_safety_checker": False},
        notes="512x512 native; int8 dynamic made it slower in the blog's own numbers.",
    ),
    "ssd1b": ModelSpec(
        key="ssd1b", name="Segmind Stable Diffusion 1B (SSD-1B)",
        hub_id="segmind/SSD-1B",
        pipeline_class="StableDiffusionXLPipeline", family="unet",
        resolution=1024, steps=30, guidance=9.0,
        tokenizers={"tokenizer": "clip", "tokenizer_2": "clip"}, max_tokens=77,
        scheduler=_EULER,
        # SDXL with residual and transformer blocks removed: a mid block without attention
        # and per-block transformer depths (diffusers' reverse_transformer_layers_per_block).
        full={"unet": _sdxl_unet(mid_block_type="UNetMidBlock2D",
                                 transformer_layers_per_block=[[1], [2, 2], [4, 4]],
                                 reverse_transformer_layers_per_block=[[4, 4, 10], [2, 1, 1],
                                                                       1]),
              "vae": _SDXL_VAE, "text_encoder": CLIP_L, "text_encoder_2": _CLIP_BIGG},
        tiny={"unet": _tiny_sdxl_unet(mid_block_type="UNetMidBlock2D",
                                      reverse_transformer_layers_per_block=[[2, 1], 1]),
              "vae": _TINY_VAE, "text_encoder": TINY_CLIP,
              "text_encoder_2": _TINY_CLIP_PROJ},
        pipeline_kwargs={"add_watermarker": False},
        notes="Distilled SDXL: same text encoders and VAE, a ~1.3B-parameter UNet.",
    ),
    "pixart": ModelSpec(
        key="pixart", name="PixArt-alpha XL-2 1024-MS",
        hub_id="PixArt-alpha/PixArt-XL-2-1024-MS",
        pipeline_class="PixArtAlphaPipeline", family="transformer",
        resolution=1024, steps=30, guidance=4.5,
        tokenizers={"tokenizer": "t5"}, max_tokens=120,
        scheduler=Component("diffusers", "DPMSolverMultistepScheduler", dict(
            beta_start=0.0001, beta_end=0.02, beta_schedule="linear", num_train_timesteps=1000,
            solver_order=2, algorithm_type="dpmsolver++", prediction_type="epsilon",
            lower_order_final=True)),
        full={"transformer": _pixart(128, 28, 16, 72, 1152, 4096), "vae": _SD_VAE,
              "text_encoder": T5_XXL},
        tiny={"transformer": _pixart(8, 2, 2, 8, 16, 32), "vae": _TINY_VAE,
              "text_encoder": TINY_T5},
        call_kwargs={"use_resolution_binning": False, "clean_caption": False},
        notes="Transformer denoiser (DiT) with a 4.8B-parameter T5-XXL text encoder.",
    ),
    **FLUX_MODELS,  # "flux" (FLUX.1-dev) and "flux-schnell" (FLUX.1-schnell): flux.py
}

def size_multiple(model: str | ModelSpec) -> int:
    """ModelSpec.size_multiple of a model given by its key (where a run holds the spec, it
    reads the property)."""
    return get_spec(model).size_multiple


def get_spec(model: str) -> ModelSpec:
    """The spec of `model`; a clear error listing the known ones otherwise."""
    if isinstance(model, ModelSpec):
        return model
    try:
        return MODELS[model]
    except (KeyError, TypeError):
        raise FastdiffError(f"Unknown model {model!r}. Known models: "
                            f"{', '.join(sorted(MODELS))}.") from None
