"""diffusers' own cache hooks against the course's step cache, on a Flux pipeline: what each
runs, what it reads on the host, whether it compiles with fullgraph, what dynamo makes of it
without, and how far it moves the image.

Introduced in 19_flux.ipynb. The hooks are diffusers' (CacheMixin.enable_cache,
diffusers/models/cache_utils.py:40, on FluxTransformer2DModel): FirstBlockCache
(hooks/first_block_cache.py) and TaylorSeer (hooks/taylorseer_cache.py). The compile columns are
dynamo's own decisions (backend "eager": frames, graph breaks, recompiles are what dynamo
makes of the code, whichever backend then generates kernels), so they are measured in seconds
on a CPU; kernels and CUDA graphs are tests/gpu's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from ..errors import FastdiffError
from ..models.loading import call_kwargs, free_memory, get_denoiser, load_pipeline
from ..models.presets import get_spec
from ..techniques.step_cache import step_cache, step_plan
from ..measure.compile_events import events_between, snapshot
from ..measure.quality import compare_images

# what reads a tensor's value on the host: on a GPU each waits for the queue (a sync)
HOST_READS = (torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.tolist,
              torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__)


class _HostReads(TorchFunctionMode):
    """Counts HOST_READS made while `inside` is set (the transformer's calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.count = False, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.inside and func in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _variants(every: int, threshold: float, interval: int) -> dict[str, Callable]:
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig

    def fbc(pipe):
        pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))

    def taylor(pipe):
        pipe.transformer.enable_cache(TaylorSeerCacheConfig(
            cache_interval=interval, taylor_factors_dtype=torch.float32))

    return {"none": lambda pipe: None,
            f"FirstBlockCache(threshold={threshold:g})": fbc,
            f"TaylorSeer(cache_interval={interval})": taylor,
            f"fdh.step_cache(every={every})": lambda pipe: step_cache(pipe, every=every)}


def _call(pipe, steps: int, seed: int, output_type: str = "np"):
    kwargs = call_kwargs(pipe, steps=steps, seed=seed)
    kwargs["output_type"] = output_type
    return pipe(**kwargs).images


def _eager(pipe, steps: int, runs: int, seed: int) -> dict[str, Any]:
    """Calls of the last block's attention and MLP, host reads inside the transformer,
    seconds (median of `runs`) and the image, from eager calls."""
    denoiser = get_denoiser(pipe)
    last = denoiser.single_transformer_blocks[-1]
    ran = {"attention": 0, "mlp": 0}
    attn_in = last.attn.to_qkv if getattr(last.attn, "fused_projections", False) else last.attn.to_q
    hooks = [attn_in.register_forward_hook(lambda *a: ran.__setitem__("attention",
                                                                      ran["attention"] + 1))]
    hooks.append(last.proj_mlp.register_forward_hook(lambda *a: ran.__setitem__("mlp",
                                                                              ran["mlp"] + 1)))
    reads = _HostReads()
    hooks.append(denoiser.register_forward_pre_hook(lambda *a: setattr(reads, "inside", True)))
    hooks.append(denoiser.register_forward_hook(lambda *a: setattr(reads, "inside", False)))
    try:
        with reads:
            image = _call(pipe, steps, seed)[0]
        counted = dict(ran)
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            _call(pipe, steps, seed)
            seconds.append(time.perf_counter() - started)
    finally:
        for h in hooks:
            h.remove()
    return {"last block attention": counted["attention"], "last block MLP": counted["mlp"],
            "host reads": reads.count, "seconds": statistics.median(seconds), "image": image}


def _compiled(make, steps: int, seed: int, fullgraph: bool) -> dict[str, Any]:
    """Dynamo's decisions for one variant: the first call's frames and graph breaks, then the
    frames two more calls add (recompiles); with fullgraph, whether it compiles at all."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    pipe = make()
    plan = step_plan(pipe)
    if plan is not None:
        plan.compile(backend="eager", fullgraph=fullgraph)
    else:
        get_denoiser(pipe).compile(backend="eager", fullgraph=fullgraph)
    breaks = sum(counters["graph_break"].values())
    before = snapshot()
    try:
        _call(pipe, steps, seed, "latent")
    except Exception as exc:  # noqa: BLE001 -- what dynamo refuses is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    first = events_between(before, snapshot())["frames"]
    breaks = sum(counters["graph_break"].values()) - breaks
    before = snapshot()
    for _ in range(2):
        _call(pipe, steps, seed, "latent")
    again = events_between(before, snapshot())["frames"]
    return {"ok": True, "frames": first, "graph breaks": breaks, "recompiles": again}


def cache_hooks_report(model: str = "flux", weights: str = "tiny", device: str = "cpu",
                       steps: int = 8, every: int = 3, threshold: float = 0.4,
                       interval: int = 3, runs: int = 3, seed: int = 0, dynamo: bool = True,
                       verbose: bool = True) -> list[dict[str, Any]]:
    """One row per cache: none, diffusers' FirstBlockCache(threshold) and
    TaylorSeer(cache_interval=interval) through enable_cache, and fdh.step_cache(every), each
    on a fresh pipeline: how many of `steps` ran the last block's attention and MLP, the host
    reads inside the transformer (each a sync on a GPU), the eager seconds, the image's PSNR
    and largest difference against no cache, and dynamo's decisions (backend "eager"): with
    fullgraph=True whether it compiles, and the frames of the first call, its graph breaks and
    the frames two more calls add (recompiles), with fullgraph where it compiles, else without.
    The default threshold, 0.4, makes the tiny model's FirstBlockCache run the whole
    transformer on 4 of 8 steps, about as often as the step cache's every=3 (diffusers'
    default, 0.05, skips no step there); on real weights pick it by its quality. On tiny or
    random weights the image figures show that a cache runs and how far it moves the
    numbers, never its quality. `dynamo=False` leaves the compile columns out ("-"): the
    eager columns alone take a few seconds. Introduced in 19_flux.ipynb."""
    if get_spec(model).family != "flux":
        raise FastdiffError(f"model={model!r}: diffusers' cache hooks compared here are "
                            "Flux's (CacheMixin); use 'flux' or 'flux-schnell'.")
    rows: list[dict[str, Any]] = []
    baseline = None
    for name, variant in _variants(every, threshold, interval).items():
        def make():
            pipe = load_pipeline(model, weights=weights, device=device, verbose=False)
            variant(pipe)
            return pipe

        with torch.no_grad():
            row = {"cache": name, **_eager(make(), steps, runs, seed)}
        image = row.pop("image")
        baseline = image if baseline is None else baseline
        quality = compare_images(image, baseline)
        row.update(psnr=quality["psnr"], max_abs=quality["max_abs"])
        row.update(dict.fromkeys(("fullgraph", "frames", "graph breaks", "recompiles"), "-"))
        if dynamo:
            full = _compiled(make, steps, seed, fullgraph=True)
            row["fullgraph"] = "compiles" if full["ok"] else full["error"]
            # where fullgraph compiles, its frames are the answer; else what dynamo does without
            partial = full if full["ok"] else _compiled(make, steps, seed, fullgraph=False)
            row.update({k: partial.get(k) for k in ("frames", "graph breaks", "recompiles")})
        rows.append(row)
        free_memory()
    if verbose:
        for r in rows:
            print(f"{r['cache']:31} last block's attention ran {r['last block attention']} "
                  f"and MLP {r['last block MLP']} of {steps} steps, host reads {r['host reads']}, "
                  f"{r['seconds'] * 1000:.0f} ms, PSNR {r['psnr']:.1f} dB, max abs "
                  f"{r['max_abs']:.3f}; dynamo: {r['frames']} frames, {r['graph breaks']} "
                  f"breaks, {r['recompiles']} recompiles; fullgraph: {r['fullgraph']}")
    return rows
