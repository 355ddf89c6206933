"""Flux.1, the fifth model of the course: FLUX.1-dev ("flux") and FLUX.1-schnell
("flux-schnell"), with their published figures.

Introduced in 19_flux.ipynb. Pure data, like presets.py (which adds these specs to
fdh.MODELS): imports nothing of the package but spec.py.

The full-size configs are the hub's (black-forest-labs/FLUX.1-dev and FLUX.1-schnell:
transformer/config.json, vae/config.json, scheduler/scheduler_config.json), the same
architecture as Black Forest Labs' own code (black-forest-labs/flux, src/flux/util.py:
hidden_size 3072, 24 heads, depth 19 double and 38 single blocks, axes_dim [16, 56, 56],
z_channels 16, scale_factor 0.3611, shift_factor 0.1159). The two variants differ in the
transformer's guidance embedder, the scheduler's shift and the call's defaults (schnell's as
its model card runs it), each said where it is set below.
"""

from __future__ import annotations

from typing import Any

from .spec import CLIP_L, T5_XXL, TINY_CLIP, TINY_T5, Component, ModelSpec, autoencoder


def _transformer(guidance: bool, **over: Any) -> Component:
    return Component("diffusers", "FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
        guidance_embeds=guidance, axes_dims_rope=[16, 56, 56]) | over)


# 16 latent channels, no quant convs: vae/config.json of both variants
_VAE = dict(latent=16, scaling_factor=0.3611, shift_factor=0.1159, force_upcast=True,
            use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
_FULL = {"vae": autoencoder(sample_size=1024, **_VAE), "text_encoder": CLIP_L,
         "text_encoder_2": T5_XXL}
_TINY = {"vae": autoencoder((8, 16, 16, 16), 4, 1, sample_size=64, **_VAE),
         "text_encoder": TINY_CLIP, "text_encoder_2": TINY_T5}


def _spec(key: str, name: str, guidance_embeds: bool, steps: int, guidance: float,
          tokens: int, notes: str) -> ModelSpec:
    # the tiny transformer: in_channels = 4 x the VAE's 16 latent channels (2x2 packing);
    # joint_attention_dim = the tiny T5's d_model, pooled_projection_dim = the tiny CLIP's
    # hidden size (its pooler output); the three rotary axes add up to the head dim.
    tiny = _transformer(guidance_embeds, num_layers=2, num_single_layers=2, attention_head_dim=16,
                        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                        axes_dims_rope=[4, 6, 6])
    # scheduler_config.json: dev shifts the sigmas by the image's token count (mu from
    # base/max_image_seq_len and base/max_shift, pipeline_flux.py:826-833); schnell keeps them
    scheduler = Component("diffusers", "FlowMatchEulerDiscreteScheduler", dict(
        num_train_timesteps=1000, shift=3.0 if guidance_embeds else 1.0,
        use_dynamic_shifting=guidance_embeds, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096))
    return ModelSpec(
        key=key, name=name, hub_id=f"black-forest-labs/{name.split()[0]}",
        pipeline_class="FluxPipeline", family="flux", resolution=1024, steps=steps,
        guidance=guidance, tokenizers={"tokenizer": "clip", "tokenizer_2": "t5"},
        max_tokens=tokens, scheduler=scheduler,
        full={"transformer": _transformer(guidance_embeds), **_FULL},
        tiny={"transformer": tiny, **_TINY},
        call_kwargs={"max_sequence_length": tokens}, notes=notes, packing=2, cfg=False,
        ladders=("flux",))


FLUX_MODELS: dict[str, ModelSpec] = {
    "flux": _spec("flux", "FLUX.1-dev (Flux.1 [dev])", True, 28, 3.5, 512,
                  "Guidance-distilled: guidance is an input of the one transformer call per "
                  "step. 12 billion parameters, with the 4.8B-parameter T5-XXL encoder."),
    "flux-schnell": _spec("flux-schnell", "FLUX.1-schnell (Flux.1 [schnell])", False, 4, 0.0,
                          256, "Timestep-distilled: 4 steps, no guidance."),
}
