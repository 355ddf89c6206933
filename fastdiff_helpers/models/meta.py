"""Meta-device copies of a pipeline's parts and the inputs the pipelines give them: what the
FLOP count (measure/flops.py) and the GEMM-shape count (below) run, with no weights and no
memory, in seconds even for the full-size models.

Introduced in 01_baseline.ipynb (FLOPs per image) and 13_autotuning.ipynb (the shapes
max-autotune tunes).
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any

import torch

from .loading import native_resolution, pipeline_spec
from .presets import Component, ModelSpec, get_spec

__all__ = ["gemm_shapes"]

# (library, "module:ClassName", "module:ConfigClass" or None, config as sorted JSON)
Key = tuple[str, str, "str | None", str]


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def spec_key(comp: Component) -> Key:
    """Key of a preset component (the configs fdh.load_pipeline builds from)."""
    lib = importlib.import_module(comp.library)
    cls = getattr(lib, comp.class_name)
    cfg_cls = _path(getattr(lib, comp.config_class)) if comp.config_class else None
    return (comp.library, _path(cls), cfg_cls, json.dumps(comp.config, sort_keys=True))


def module_key(module: torch.nn.Module) -> Key:
    """Key of a live component: its class and full config (weights, dtype, device ignored)."""
    module = getattr(module, "_orig_mod", module)  # a torch.compile(module) wrapper
    config = module.config
    if hasattr(config, "to_json_string"):  # transformers PretrainedConfig
        cfg = json.dumps(config.to_dict(), sort_keys=True, default=str)
        return ("transformers", _path(type(module)), _path(type(config)), cfg)
    cfg = json.dumps(dict(config), sort_keys=True, default=str)
    return ("diffusers", _path(type(module)), None, cfg)


def meta_copy(key: Key) -> torch.nn.Module:
    """A new module of `key`'s class and config on the meta device, in eval mode."""
    library, cls_path, cfg_path, cfg_json = key
    cls = _import(cls_path)
    config = json.loads(cfg_json)
    with torch.device("meta"):
        if library == "diffusers":
            model = cls.from_config(config)
        else:
            model = cls(_import(cfg_path).from_dict(config))
    return model.eval()


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def denoiser_inputs(model, batch: int, height: int, width: int, tokens: int,
                    pooled_dim: int | None, dtype: torch.dtype = torch.float32
                    ) -> dict[str, Any]:
    """Meta inputs of one denoiser call, by keyword, as the pipelines pass them."""
    cfg = model.config
    h, w = height // 8, width // 8

    def t(*shape: int) -> torch.Tensor:
        return meta(*shape, dtype=dtype)

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
    kwargs: dict[str, Any] = dict(sample=sample, timestep=timestep,
                                  encoder_hidden_states=t(batch, tokens,
                                                          cfg.cross_attention_dim))
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


# --- the shapes max-autotune benchmarks -------------------------------------------------------

def _recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    # what inductor's max-autotune tunes with its GEMM/convolution templates (mm, addmm,
    # convolution: torch/_inductor/kernel/mm.py, conv.py); the attention's bmm goes to SDPA's
    # own kernels on a GPU, so a meta run's decomposed bmm is not counted
    tuned = {aten.mm, aten.addmm, aten.convolution}

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: set[tuple] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in tuned:
                shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
                rest = repr([a for a in args if not isinstance(a, torch.Tensor)])
                self.seen.add((func.overloadpacket.__name__, shapes, rest))
            return func(*args, **(kwargs or {}))

    return Shapes()


@functools.lru_cache(maxsize=32)
def _shapes(key: Key, inputs: str, batch: int, height: int, width: int, tokens: int,
            pooled: int | None) -> frozenset:
    model = torch.nn.Module.to(meta_copy(key), torch.bfloat16)  # diffusers own .to() warns
    recorder = _recorder()
    with torch.no_grad(), recorder:
        if inputs == "vae":
            model.decode(vae_latents(model, height, width, torch.bfloat16))
        else:
            model(**denoiser_inputs(model, batch, height, width, tokens, pooled,
                                    torch.bfloat16))
    return frozenset(recorder.seen)


def gemm_shapes(pipe_or_model: Any, height: int | None = None, width: int | None = None,
                vae: bool = True) -> int:
    """How many distinct GEMM and convolution shapes (mm, addmm, convolution, with their
    strides and padding) one bf16 denoiser call, at the batch classifier-free guidance gives
    it, and (with `vae`) one VAE decode run at height x width (default: the model's native
    size): what max-autotune benchmarks one by one on a big GPU. Counted on meta copies.
    SDXL's UNet at 1024x1024 has 42, the number an H100's max-autotune compile autotuned
    (results/h100-80gb-hbm3/sdxl/compile-attempts.log); the architecture before any surgery
    (fused QKV and the 1x1-conv swap move a few shapes between kinds).
    Introduced in 13_autotuning.ipynb."""
    if isinstance(pipe_or_model, (str, ModelSpec)):
        spec = get_spec(pipe_or_model)
        keys = {name: spec_key(c) for name, c in spec.full.items()}
        size = spec.resolution
    else:
        spec = pipeline_spec(pipe_or_model)
        names = (spec.denoiser, "vae", "text_encoder_2")
        keys = {n: module_key(getattr(pipe_or_model, n)) for n in names
                if getattr(pipe_or_model, n, None) is not None}
        size = native_resolution(pipe_or_model)
    height, width = height or size, width or size
    batch = 2 if spec.cfg and spec.guidance > 1.0 else 1
    seen = _shapes(keys[spec.denoiser], "denoiser", batch, height, width, spec.max_tokens,
                   pooled_dim(keys))
    if vae:  # a shape both run is benchmarked once (inductor's timings are per shape)
        seen |= _shapes(keys["vae"], "vae", 1, height, width, 0, None)
    return len(seen)


@functools.lru_cache(maxsize=16)
def graph_ops(model: str, part: str = "denoiser") -> int:
    """How many ops dynamo captures in one bf16 call of a full-size model's denoiser (at the
    batch classifier-free guidance gives it) or VAE decode, at its native size: the size of
    the graph inductor compiles, traced on meta copies with dynamo's ExplainWithBackend (no
    weights, no compile: seconds). The course clock scales compile times by it.
    Introduced with the course clock (docs/workshop.md: "The course clock")."""
    from torch._dynamo.backends.debugging import ExplainWithBackend

    from torch._dynamo.eval_frame import remove_from_cache

    spec = get_spec(model)
    keys = {name: spec_key(c) for name, c in spec.full.items()}
    module = torch.nn.Module.to(meta_copy(keys[spec.denoiser if part == "denoiser" else "vae"]),
                                torch.bfloat16)
    if part == "denoiser":
        batch = 2 if spec.cfg and spec.guidance > 1.0 else 1
        fn, args = module, denoiser_inputs(module, batch, spec.resolution, spec.resolution,
                                           spec.max_tokens, pooled_dim(keys), torch.bfloat16)
        args = (), {**args, "return_dict": False}
    else:
        fn, args = module.decode, ((vae_latents(module, spec.resolution, spec.resolution,
                                                torch.bfloat16),), {})

    def traced(*a, **k):  # a code object of its own: its cache entries are dropped below
        return fn(*a, **k)

    explainer = ExplainWithBackend("eager")
    try:
        with torch.no_grad():
            torch.compile(traced, backend=explainer)(*args[0], **args[1])
    finally:
        remove_from_cache(traced)
    return explainer.output().op_count
