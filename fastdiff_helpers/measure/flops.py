"""FLOPs per image, counted from the architecture; the matmul rate that turns them into a floor.

Introduced in 01_baseline.ipynb. The count runs each component once on META-device copies
built from the component's config under torch.utils.flop_counter.FlopCounterMode: no
weights, no memory, seconds even for PixArt's 4.8B-parameter T5. Matmuls, convolutions and
attention are counted (on meta tensors SDPA runs its math decomposition, whose matmuls count
the same as the classic processor's baddbmm/bmm; on a real CPU FlopCounterMode has no
formula for SDPA's flash kernel and would miss it). Elementwise work (norms, activations)
is not counted, as is the convention.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..errors import FastdiffError
from .. import checks
from ..models.loading import native_resolution, pipeline_spec
from ..models.meta import Key as _Key, denoiser_inputs as _denoiser_inputs, meta as _meta
from ..models.meta import meta_copy as _meta_copy, module_key as _module_key, pooled_dim
from ..models.meta import spec_key as _spec_key, vae_latents
from ..models.noise import quiet_known_noise
from ..models.build import build_scheduler
from ..models.presets import ModelSpec, get_spec
from ..techniques.cache_paths import PATHS
from ..techniques.step_cache import cached_schedule, guided_steps, plan_settings
from .timing import StageMarks, synchronize

__all__ = ["count_flops", "denoiser_calls", "flop_floor_seconds", "measure_matmul_tflops"]

_TEXT_ENCODERS = ("text_encoder", "text_encoder_2")


def _count(fn, *args, **kwargs) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


@functools.lru_cache(maxsize=32)
def _denoiser_flops(key: _Key, batch: int, height: int, width: int, tokens: int,
                    pooled_dim: int | None, path: str = "full", family: str = "",
                    branch: int = 1) -> int:
    """FLOPs of one denoiser call on `path`: "full", or "cached", a cached step of the step
    cache (techniques/cache_paths.py) counted as what it computes, the shallow branch."""
    model = _meta_copy(key)
    inputs = _denoiser_inputs(model, batch, height, width, tokens, pooled_dim)
    if path == "full":
        return _count(model, **inputs)
    full, cached, _ = PATHS[family]
    with torch.no_grad():
        _, feature = full(model, branch, **inputs)
    return _count(cached, model, branch, feature, **inputs)


@functools.lru_cache(maxsize=32)
def _vae_decode_flops(key: _Key, height: int, width: int) -> int:
    vae = _meta_copy(key)
    return _count(vae.decode, vae_latents(vae, height, width))


@functools.lru_cache(maxsize=32)
def _text_encoder_flops(key: _Key, tokens: int) -> int:
    # attention_mask is left out: it does not change the FLOPs, and T5's mask code calls
    # .item(), which meta tensors refuse.
    return _count(_meta_copy(key), _meta(1, tokens, dtype=torch.long))


def denoiser_calls(scheduler: Any, steps: int) -> int:
    """How many times a pipeline calls its denoiser for `steps` inference steps: once per
    timestep its scheduler sets, since the pipelines loop over scheduler.timesteps
    (pipeline_stable_diffusion.py:1032, `for i, t in enumerate(timesteps)`). PNDM as SD1.5
    ships it (skip_prk_steps) sets steps + 1 (scheduling_pndm.py:213 repeats the second-last
    timestep); a second-order scheduler such as Heun sets 2 * steps - 1. Counted on a copy made
    from the scheduler's config: the pipeline's own scheduler keeps its state."""
    checks.whole("steps", steps, 1)
    fresh = type(scheduler).from_config(scheduler.config)
    # Flux's dynamic shift needs the image's mu (pipeline_flux.py:827); it moves the sigmas,
    # not their count
    extra = {"mu": 1.0} if fresh.config.get("use_dynamic_shifting") else {}
    fresh.set_timesteps(steps, device="cpu", **extra)
    return len(fresh.timesteps)


def count_flops(pipe_or_model_key: Any, height: int | None = None, width: int | None = None,
                steps: int | None = None, guidance: float | None = None,
                guidance_stop: float | None = None) -> dict[str, Any]:
    """FLOPs of one image, counted from the architecture. Introduced in 01_baseline.ipynb.

    `pipe_or_model_key`: a pipeline from fdh.load_pipeline (its own component configs, tiny
    or full-size) or a model key ("sdxl", "sd15", "ssd1b", "pixart", "flux", "flux-schnell":
    the full-size model). Height, width, steps and guidance default to the model's (tiny
    pipelines: 64x64). With classifier-free guidance (guidance > 1) the denoiser runs on a
    batch of 2; Flux's guidance is an input of its one call (batch 1).

    Returns FLOPs (not FLOP/s): denoiser_per_forward (one call at that batch), vae_decode,
    text_encoders (every encoder pass of one prompt, plus the negative prompt's where the
    pipeline encodes it), denoiser_total (every denoiser call, one per timestep the
    scheduler sets: denoiser_calls below, e.g. 31 for SD1.5's PNDM at 30 steps; each is
    denoiser_per_forward unless a pipeline runs fewer denoiser FLOPs: fdh.step_cache counts a
    cached step as the shallow branch it computes, fdh.stop_guidance the unguided steps at
    batch 1), per_image = denoiser_total + vae_decode + text_encoders, schedule (each step's
    path and batch, e.g. "full/2", "cached/1"), and batch, height, width, steps, calls.
    `guidance_stop`: the share of the steps that keep guidance where a callback passed on the
    call stops it (fdh.benchmark's callback_on_step_end), in place of the pipeline's own
    (None). Cached per configuration."""
    if isinstance(pipe_or_model_key, (str, ModelSpec)):  # the full-size model as it ships
        spec = get_spec(pipe_or_model_key)
        quiet_known_noise()  # before diffusers (and torchao through it) is first imported
        keys = {name: _spec_key(c) for name, c in spec.full.items()}
        import diffusers
        init = inspect.signature(getattr(diffusers, spec.pipeline_class).__init__).parameters
        zeros = getattr(init.get("force_zeros_for_empty_prompt"), "default", False)
        size, scheduler = spec.resolution, build_scheduler(spec.scheduler)
        plan = {"every": 1, "branch": 1, "guidance_stop": None}
    else:
        pipe = pipe_or_model_key
        spec = pipeline_spec(pipe)
        names = (spec.denoiser, "vae", *_TEXT_ENCODERS)
        keys = {n: _module_key(getattr(pipe, n)) for n in names
                if getattr(pipe, n, None) is not None}
        # SDXL's pipeline uses zeros for an empty negative prompt instead of encoding it.
        zeros = bool(pipe.config.get("force_zeros_for_empty_prompt", False))
        size, scheduler, plan = native_resolution(pipe), pipe.scheduler, plan_settings(pipe)
    tokens = spec.max_tokens
    checks.call_size(steps, height, width, spec.size_multiple)
    checks.real("guidance", guidance, none=True)
    stop = checks.real("guidance_stop", guidance_stop, none=True)
    if stop is not None and not 0 < stop <= 1:
        raise FastdiffError(f"{checks.arg('guidance_stop', guidance_stop)} cannot work: give "
                            "the share of the steps that keep guidance, above 0 and at most 1.")
    height, width = height or size, width or size
    steps = steps or spec.steps
    guidance = spec.guidance if guidance is None else guidance
    cfg = spec.cfg and guidance > 1.0  # Flux: guidance is an input of the one call, batch 1
    batch = 2 if cfg else 1
    pooled = pooled_dim(keys)
    denoiser = _denoiser_flops(keys[spec.denoiser], batch, height, width, tokens, pooled)
    vae = _vae_decode_flops(keys["vae"], height, width)
    passes = 2 if cfg and not zeros else 1
    # each encoder at its own tokenizer's length: CLIP's 77, T5's max_tokens (Flux has both)
    lengths = {name.replace("tokenizer", "text_encoder"): 77 if kind == "clip" else tokens
               for name, kind in spec.tokenizers.items()}
    text = sum(passes * _text_encoder_flops(keys[name], lengths.get(name, tokens))
               for name in _TEXT_ENCODERS if name in keys)
    calls = denoiser_calls(scheduler, steps)
    # guidance stops after a share of the inference steps on the UNet pipelines (diffusers'
    # cut-off callback at that step index: techniques/guidance.py) and of the denoiser's calls
    # on PixArt (the StepPlan counts calls); the two differ only where calls != steps
    share = plan["guidance_stop"] if guidance_stop is None else guidance_stop
    if not cfg:
        guided = 0
    elif spec.family == "transformer":
        guided = guided_steps(calls, share)
    else:
        guided = guided_steps(steps, share)
        guided = calls if guided >= steps else guided
    schedule = cached_schedule(calls, plan["every"], guided)
    per_step = {("full", batch): denoiser}
    for path, b in set(schedule) - set(per_step):
        per_step[path, b] = _denoiser_flops(keys[spec.denoiser], b, height, width, tokens,
                                            pooled, path, spec.family, plan["branch"])
    total = sum(per_step[s] for s in schedule)
    return {"denoiser_per_forward": denoiser, "vae_decode": vae, "text_encoders": text,
            "denoiser_total": total, "per_image": total + vae + text, "batch": batch,
            "height": height, "width": width, "steps": steps, "calls": calls,
            "schedule": ["/".join((p, str(b))) for p, b in schedule]}


def flop_floor_seconds(flops_per_image: float | dict, tflops_per_s: float) -> float:
    """The time one image would take if every FLOP ran at `tflops_per_s` (a lower bound).

    Accepts a FLOP count or count_flops()'s dict. Introduced in 01_baseline.ipynb."""
    if isinstance(flops_per_image, dict):
        flops_per_image = flops_per_image["per_image"]
    if checks.real("tflops_per_s", tflops_per_s) <= 0:
        raise FastdiffError(f"{checks.arg('tflops_per_s', tflops_per_s)} cannot work: give the "
                            "measured rate, a positive number (fdh.measure_matmul_tflops).")
    return float(flops_per_image) / (tflops_per_s * 1e12)


def measure_matmul_tflops(device: str = "cuda", dtype: torch.dtype | None = None,
                          n: int = 8192, iters: int = 20) -> float:
    """Dense matmul rate in TFLOP/s: n x n @ n x n, timed after warm-up (CUDA events on a GPU,
    perf_counter on a CPU). dtype: bf16 on a GPU and fp32 on a CPU unless given (a given one
    is measured as given). On a CPU n is capped at 1024 and iters at a quarter, at least 3.
    Introduced in 01_baseline.ipynb."""
    dev = torch.device(checks.device(device))
    checks.whole("n", n, 1)
    checks.whole("iters", iters, 1)
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise FastdiffError(f"{checks.arg('dtype', dtype)} cannot work: give a floating-point "
                            "torch dtype, e.g. torch.bfloat16.")
    if dev.type != "cuda":
        n, iters = min(n, 1024), max(3, iters // 4)
    gen = torch.Generator(dev).manual_seed(0)
    a, b = torch.randn(2, n, n, device=dev, dtype=torch.float32, generator=gen).to(dtype)
    for _ in range(3):  # warm-up: kernel selection, clocks
        a @ b
    clock = StageMarks(dev)  # benchmark()'s clock: CUDA events on a GPU, else perf_counter
    synchronize(dev)
    start = clock.now()
    for _ in range(iters):
        a @ b
    return 2 * n**3 * iters / clock.seconds(start, clock.now()) / 1e12
