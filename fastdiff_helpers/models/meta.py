"""Meta-device copies of a pipeline's parts and the inputs the pipelines give them: what the
FLOP count (measure/flops.py) and the course's GEMM-shape and graph counts
(course/planning/shapes.py) run, with no weights and no memory, in seconds even for the
full-size models.

Introduced in 01_baseline.ipynb (FLOPs per image).
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any

import torch

from .presets import Component

# (library, class, config class (transformers') or None, config as sorted JSON)
Key = tuple[str, type, "type | None", str]


def spec_key(comp: Component) -> Key:
    """Key of a preset component (the configs fdh.load_pipeline builds from)."""
    lib = importlib.import_module(comp.library)
    cfg_cls = getattr(lib, comp.config_class) if comp.config_class else None
    return (comp.library, getattr(lib, comp.class_name), cfg_cls,
            json.dumps(comp.config, sort_keys=True))


def module_key(module: torch.nn.Module) -> Key:
    """Key of a live component: its class and full config (weights, dtype, device ignored)."""
    module = getattr(module, "_orig_mod", module)  # a torch.compile(module) wrapper
    config = module.config
    if hasattr(config, "to_json_string"):  # transformers PretrainedConfig
        cfg = json.dumps(config.to_dict(), sort_keys=True, default=str)
        return ("transformers", type(module), type(config), cfg)
    cfg = json.dumps(dict(config), sort_keys=True, default=str)
    return ("diffusers", type(module), None, cfg)


def meta_copy(key: Key) -> torch.nn.Module:
    """A new module of `key`'s class and config on the meta device, in eval mode."""
    library, cls, cfg_cls, cfg_json = key
    config = json.loads(cfg_json)
    with torch.device("meta"):
        if library == "diffusers":
            return cls.from_config(config).eval()
        return cls(cfg_cls.from_dict(config)).eval()


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def denoiser_inputs(model, batch: int, height: int, width: int, tokens: int,
                    pooled_dim: int | None, dtype: torch.dtype = torch.float32
                    ) -> dict[str, Any]:
    """Meta inputs of one denoiser call, by keyword, as the pipelines pass them."""
    cfg = model.config
    h, w = height // 8, width // 8
    t = functools.partial(meta, dtype=dtype)
    timestep = t(batch)
    if "joint_attention_dim" in cfg:  # Flux: 2x2 latent patches packed into tokens
        tokens_img = (h // 2) * (w // 2)
        kwargs = dict(hidden_states=t(batch, tokens_img, cfg.in_channels),
                      encoder_hidden_states=t(batch, tokens, cfg.joint_attention_dim),
                      pooled_projections=t(batch, cfg.pooled_projection_dim),
                      timestep=timestep, img_ids=t(tokens_img, 3), txt_ids=t(tokens, 3))
        if cfg.guidance_embeds:  # FLUX.1-dev's guidance: an input, not a second batch
            kwargs["guidance"] = t(batch)
        return kwargs
    sample = t(batch, cfg.in_channels, h, w)
    if "caption_channels" in cfg:  # PixArt-style transformer
        added = {"resolution": None, "aspect_ratio": None}
        if getattr(model, "use_additional_conditions", False):
            added = {"resolution": t(batch, 2), "aspect_ratio": t(batch, 1)}
        text = t(batch, tokens, cfg.caption_channels)
        return dict(hidden_states=sample, encoder_hidden_states=text, timestep=timestep,
                    added_cond_kwargs=added, encoder_attention_mask=t(batch, tokens))
    text = t(batch, tokens, cfg.cross_attention_dim)
    kwargs: dict[str, Any] = dict(sample=sample, timestep=timestep, encoder_hidden_states=text)
    if cfg.addition_embed_type == "text_time":  # SDXL / SSD-1B: pooled text + 6 time ids
        if pooled_dim is None:
            pooled_dim = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
        kwargs["added_cond_kwargs"] = {"text_embeds": t(batch, pooled_dim),
                                       "time_ids": t(batch, 6)}
    return kwargs


def vae_latents(vae, height: int, width: int, dtype: torch.dtype = torch.float32
                ) -> torch.Tensor:
    """Meta latents of one VAE decode of a height x width image."""
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    return meta(1, vae.config.latent_channels, height // scale, width // scale, dtype=dtype)


def pooled_dim(keys: dict[str, Key]) -> int | None:
    """SDXL's pooled text width, from its second text encoder's config (None without one)."""
    if "text_encoder_2" not in keys:
        return None
    return json.loads(keys["text_encoder_2"][3]).get("projection_dim")
