"""load_pipeline(): one loading path for pretrained, random (full-size) and tiny weights.

Introduced in 00_setup.ipynb. diffusers is imported inside the functions that use it (cost
at import; see build.py).
"""

from __future__ import annotations

import gc
import inspect
from typing import Any

import torch

from ..errors import FastdiffError
from .. import checks
from .build import build_component, build_pipeline, cast_built
from .downloads import local_variant, say_download
from .dtypes import DTYPE_NAMES, load_dtype, resolve_dtype
from .hooks import tell
from .fit import check_fits
from .noise import quiet_known_noise
from .presets import DEFAULT_PROMPT, MODELS, SCHEDULERS, VAES, ModelSpec, get_spec
from .pretrained import check_weights, load_pretrained, require_pretrained, resolve_weights
from .state import PipelineState

def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _built(weights: str, dtype: torch.dtype, build):
    """build(dtype) for random weights; tiny weights are drawn in fp32, then cast: every dtype
    gets the fp32 baseline's weights, rounded (drawn in bf16 they are other weights)."""
    if weights != "tiny" or dtype == torch.float32:
        return build(dtype)
    return cast_built(build(torch.float32), dtype)


def _swap_vae(pipe, vae: str, weights: str, device: str, dtype: torch.dtype, seed: int,
              verbose: bool = True) -> str:
    """Put the named VAE in place of the pipeline's own; returns where it came from."""
    hub_id, full, tiny = VAES[vae]
    if weights == "pretrained":
        from diffusers import AutoencoderKL

        variant = say_download(vae, dtype, verbose)  # what it fetches, said; the disk checked
        try:
            pipe.vae = AutoencoderKL.from_pretrained(hub_id, dtype=dtype, use_safetensors=True,
                                                     variant=variant).to(device)
        except OSError as exc:
            raise FastdiffError(f"Loading the {vae} VAE ({hub_id}) failed: {exc}. Run `hf "
                                f"download {hub_id}` on a machine with network, or load without "
                                "vae=.") from None
        return hub_id
    component = full if weights == "random" else tiny
    pipe.vae = _built(weights, dtype, lambda d: build_component(component, device, d, seed + 100))
    return f"{hub_id} (config; {weights} weights)"


def load_pipeline(model: str | ModelSpec = "sdxl", weights: str = "auto", device: str | None = None,
                  dtype: str | torch.dtype = "fp32", path: str | None = None, seed: int = 0,
                  verbose: bool = True, vae: str | None = None, scheduler: str | None = None):
    """Load one of the course's pipelines (see fdh.MODELS). Introduced in 00_setup.ipynb.

    weights: "pretrained" (hub id, or `path`, safetensors only), "random" (full-size
    architecture, seeded random weights, built on the meta device and initialised on
    `device`; device="meta" allocates nothing), "tiny" (small configs for CPUs) or "auto"
    (prints its choice: fdh.course.choose_weights; on a CPU pretrained if available, else tiny; on
    a GPU the choice a parameters cell carried, else pretrained, else a FastdiffError saying
    what to do: never random weights unasked).
    dtype: the weights' dtype. Pretrained weights come in it: a half-precision load (bf16,
    fp16) fetches the repository's fp16 files where it has them (half the bytes of its fp32
    files), an fp32 load its fp32 files; a download is said, with its size, and the cache's
    disk checked, before it starts (models/downloads.py say_download).
    vae: None (the pipeline's own) or "fp16-fix" (madebyollin/sdxl-vae-fp16-fix: its weights
    when pretrained, its config otherwise), the VAE diffusion-fast used for SDXL and SSD-1B.
    scheduler: None (the pipeline's own) or "dpm-solver" (DPMSolverMultistepScheduler from the
    pipeline's scheduler config, as diffusion-fast ran SD1.5).
    A `path` is a path meant: it loads pretrained weights from that folder (weights "auto" or
    "pretrained"), or fails saying why; it never falls back to other weights.
    Every component is returned in eval mode. Every argument is checked before any work."""
    spec = get_spec(model)
    torch_dtype = resolve_dtype(dtype)
    for name, swap, known in (("vae", vae, VAES), ("scheduler", scheduler, SCHEDULERS)):
        if swap is not None and swap not in known:
            raise FastdiffError(f"Unknown {name} {swap!r}. Use one of: {', '.join(known)} (or "
                                "None for the pipeline's own).")
    checks.whole("seed", seed, 0)
    check_weights(weights)
    device = checks.device(device, meta=True) if device is not None else default_device()
    torch_dtype = load_dtype(torch_dtype, device, verbose=verbose)
    if device == "meta" and weights != "random":
        raise FastdiffError(f"{checks.arg('device', 'meta')} builds the architecture only: use "
                            f"{checks.arg('weights', 'random')}.")
    if path is not None:
        checks.existing("path", path, "a pipeline folder (written by pipe.save_pretrained() "
                        "or `hf download ID --local-dir DIR`)", folder=True)
        if weights not in ("auto", "pretrained"):
            raise FastdiffError(f"{checks.arg('path', str(path))} loads pretrained weights from "
                                f"that folder, but {checks.arg('weights', weights)} builds its "
                                "own: drop one of the two.")
        weights = "pretrained"
    quiet_known_noise()  # before diffusers (and torchao through it) is first imported
    weights = resolve_weights(spec, weights, device, path, verbose)
    if device.startswith("cuda") and weights != "tiny":  # an out-of-memory said before loading
        check_fits(spec.key, DTYPE_NAMES[torch_dtype], device)
    if weights == "pretrained":
        require_pretrained(spec, path)  # what is missing, said before any loading
        variant = (local_variant(spec.key, path, torch_dtype) if path is not None
                   else say_download(spec.key, torch_dtype, verbose))
        pipe = load_pretrained(spec, path, torch_dtype, variant=variant)
        if device != "cpu":
            pipe.to(device)
    else:
        size = "full" if weights == "random" else "tiny"
        pipe = _built(weights, torch_dtype, lambda d: build_pipeline(spec, size, device, d, seed))
    if spec.family == "flux":  # its own default size, from its VAE's
        pipe.default_sample_size = pipe.vae.config.sample_size // pipe.vae_scale_factor
    vae_source = ("pipeline" if vae is None
                  else _swap_vae(pipe, vae, weights, device, torch_dtype, seed, verbose))
    if scheduler is not None:
        import diffusers

        pipe.scheduler = getattr(diffusers, SCHEDULERS[scheduler]).from_config(
            pipe.scheduler.config)
    for comp in pipe.components.values():
        if isinstance(comp, torch.nn.Module):
            comp.eval()
    pipe.set_progress_bar_config(disable=True)
    pipe._fastdiff = PipelineState(spec, weights, str(torch_dtype), device, vae_source)
    tell("load", pipe=pipe)  # the listeners' (models/hooks.py)
    return pipe


def count_parameters(pipe) -> dict[str, int]:
    """Parameters per component, plus "total". Introduced in 00_setup.ipynb."""
    counts = {name: sum(p.numel() for p in comp.parameters())
              for name, comp in pipe.components.items() if isinstance(comp, torch.nn.Module)}
    counts["total"] = sum(counts.values())
    return counts


def free_memory() -> None:
    """Release what a finished pipeline held: dynamo's caches, Python garbage and the CUDA
    cache. Call it after `del pipe`. Introduced in 05_cold_start.ipynb."""
    # Compiled code keeps the old modules alive, and dynamo's per-function cache would fill
    # up across fresh pipelines (then it silently falls back to eager), so reset it too.
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# the course's models by pipeline class; SSD-1B is an SDXL pipeline whose UNet has a mid block
# without attention (presets.MODELS["ssd1b"]), FLUX.1-schnell a Flux pipeline whose transformer
# has no guidance embedder
_MODELS_BY_PIPELINE = {"StableDiffusionXLPipeline": "sdxl", "StableDiffusionPipeline": "sd15",
                       "PixArtAlphaPipeline": "pixart", "FluxPipeline": "flux"}


def pipeline_info(pipe) -> PipelineState:
    """What load_pipeline recorded, typed (models/state.py PipelineState): model, weights,
    dtype, device, VAE, the applied techniques and fdh.apply's recipe.

    A pipeline of the course's families loaded another way (plain diffusers from_pretrained, your
    own components) is described on first use from its class and components, so every helper
    works on it; its weights are recorded as "pretrained" when it came from a folder or the
    hub (config _name_or_path), else "user".
    Introduced in 00_setup.ipynb."""
    info = getattr(pipe, "_fastdiff", None)
    if info is None:
        key = _MODELS_BY_PIPELINE.get(type(pipe).__name__)
        if key is None:
            raise FastdiffError(f"{type(pipe).__name__} is not one of the course's pipelines "
                                f"({', '.join(_MODELS_BY_PIPELINE)}); load one with "
                                "fdh.load_pipeline(model) or diffusers' from_pretrained.")
        if key == "sdxl" and pipe.unet.config.get("mid_block_type") == "UNetMidBlock2D":
            key = "ssd1b"
        if key == "flux" and not pipe.transformer.config.get("guidance_embeds"):
            key = "flux-schnell"
        info = pipe._fastdiff = PipelineState(
            MODELS[key], "pretrained" if pipe.config.get("_name_or_path") else "user",
            str(get_denoiser(pipe).dtype), str(pipeline_device(pipe)),
            pipe.vae.config.get("_name_or_path") or "pipeline")
    return info


def pipeline_spec(pipe) -> ModelSpec:
    """The ModelSpec `pipe` was loaded as (or described as, by pipeline_info), carried on the
    pipeline: a helper handed the pipeline reads it here instead of looking the key up again."""
    return pipeline_info(pipe).spec


def native_resolution(pipe) -> int:
    """The image size the denoiser was built for: its latent sample_size times the VAE's
    downscale (1024 for SDXL, 512 for SD1.5, 64 for the tiny models). Flux's transformer has
    no sample_size: its VAE's (the hub's 1024; FluxPipeline's own default, default_sample_size
    = 128 latents at pipeline_flux.py:215, is fixed, and load_pipeline sets it from this)."""
    sample = get_denoiser(pipe).config.get("sample_size")
    if sample is None:  # Flux: its VAE's sample_size (1024 in the hub's vae/config.json)
        return int(pipe.vae.config.sample_size)
    return int(sample) * int(pipe.vae_scale_factor)


def call_kwargs(pipe, prompt: str = DEFAULT_PROMPT,
                steps: int | None = None, height: int | None = None, width: int | None = None,
                guidance: float | None = None, seed: int = 0,
                callback_on_step_end: Any = None) -> dict[str, Any]:
    """The keyword arguments the helpers pass to `pipe(...)`: the model's defaults (native or
    tiny resolution, steps, guidance) unless given, a seeded CPU generator, and per-model
    switches (PixArt: no resolution binning, no caption cleaning). Every argument is checked
    here, before any call: the helpers that call a pipeline all build their call with it.
    `callback_on_step_end`: a diffusers callback of your own, passed on the call as it stands
    (09_fewer_denoiser_calls.ipynb: diffusers' SDXLCFGCutoffCallback); refused where the
    pipeline takes none (PixArt-alpha) or already gets one from fdh.stop_guidance.
    Introduced in 02_precision.ipynb."""
    spec = pipeline_spec(pipe)
    if not isinstance(prompt, str) and not (isinstance(prompt, list) and prompt
                                            and all(isinstance(p, str) for p in prompt)):
        raise FastdiffError(f"{checks.arg('prompt', prompt)} cannot work: give a string.")
    checks.call_size(steps, height, width, spec.size_multiple)
    checks.real("guidance", guidance, none=True)
    if checks.whole("seed", seed, 0) >= 2**64:
        raise FastdiffError(f"{checks.arg('seed', seed)} cannot work: a torch generator takes "
                            "seeds below 2**64.")
    size = native_resolution(pipe)
    kwargs: dict[str, Any] = dict(
        prompt=prompt, num_inference_steps=steps or spec.steps, height=height or size,
        width=width or size, guidance_scale=spec.guidance if guidance is None else guidance,
        generator=torch.Generator("cpu").manual_seed(seed), output_type="pil")
    kwargs.update(spec.call_kwargs)
    for extra in pipeline_info(pipe).per_call:
        kwargs.update(extra(kwargs))
    if callback_on_step_end is not None:
        if "callback_on_step_end" not in inspect.signature(type(pipe).__call__).parameters:
            raise FastdiffError(f"{type(pipe).__name__} takes no callback_on_step_end: stop "
                                "guidance on it with fdh.stop_guidance(pipe, share).")
        if "guidance_stop" in pipeline_info(pipe).applied:
            raise FastdiffError("fdh.stop_guidance already passes a callback on this "
                                "pipeline's calls: load a fresh pipeline for a callback of "
                                "your own.")
        kwargs["callback_on_step_end"] = callback_on_step_end
    return kwargs


def generate(pipe, prompt: str = DEFAULT_PROMPT,
             steps: int | None = None, height: int | None = None, width: int | None = None,
             guidance: float | None = None, seed: int = 0, callback_on_step_end: Any = None):
    """One image, with the same arguments fdh.benchmark uses (`callback_on_step_end`: a
    diffusers callback of your own, fdh.call_kwargs). Introduced in 00_setup.ipynb."""
    # no inference_mode here: the pipeline runs under its own no_grad, as in benchmark(), so
    # a compiled pipeline sees the same grad mode (else a dynamo guard fails: recompile)
    return pipe(**call_kwargs(pipe, prompt, steps, height, width, guidance, seed,
                              callback_on_step_end)).images[0]


def get_denoiser(pipe) -> torch.nn.Module:
    """The denoising network: pipe.unet (SD family) or pipe.transformer (PixArt, Flux).
    Introduced in 04_torch_compile.ipynb."""
    return pipe.unet if hasattr(pipe, "unet") else pipe.transformer


def family_of(pipe) -> str:
    """The pipeline's family, as its spec states it (ModelSpec.family: "unet", "transformer" or
    "flux"). What a technique does by family it decides with this."""
    return pipeline_spec(pipe).family


def pipeline_device(pipe) -> torch.device:
    return next(get_denoiser(pipe).parameters()).device
