"""GPU checks of issue 26 (fewer denoiser calls), on a CUDA machine:
`pytest tests/gpu/test_gpu_fewer_calls.py -m gpu -v`.

What the CPU tests cannot show: CUDA graphs (reduce-overhead) captured for both paths of the step
cache, no device-to-host sync added to the loop, and the time the cache and the guidance stop
save on the full-size SD1.5 (random weights, 512x512, bf16, compiled)."""

import dataclasses

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.measure.compile_events import events_between, snapshot
from fastdiff_helpers.techniques.step_cache import step_plan

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF16 = fdh.Recipe(dtype="bf16", attention="sdpa")
COMPILED = fdh.Recipe(dtype="bf16", attention="sdpa", compile="reduce-overhead", fullgraph=True,
                      compile_vae=False)  # the course's compile step: CUDA graphs, no tuning


def sd15(recipe, model="sd15"):
    return fdh.apply(fdh.load_pipeline(model, weights="random", device="cuda"), recipe)


def image(pipe, steps=9):
    kwargs = fdh.call_kwargs(pipe, steps=steps)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0].astype(np.float64)


def test_cuda_graphs_capture_both_paths_and_keep_the_feature():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = image(sd15(dataclasses.replace(BF16, cache_every=3)))
    pipe = sd15(dataclasses.replace(COMPILED, cache_every=3))
    before = snapshot()
    compiled = image(pipe)
    assert events_between(before, snapshot())["frames"] == 2  # the full and the cached path
    # torch/_inductor/cudagraph_utils.py log_cudagraph_skip_and_bump_counter
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert step_plan(pipe).clone_feature
    before = snapshot()
    again = [image(pipe) for _ in range(2)]
    assert events_between(before, snapshot())["frames"] == 0
    # a feature overwritten by the next graph replay would make the images far apart
    for out in [compiled] + again:
        assert np.isfinite(out).all() and np.abs(out - eager).max() < 0.1


def test_a_unet_guidance_stop_compiles_a_cuda_graph_per_batch_then_nothing():
    """09_fewer_denoiser_calls: compiled, a UNet's guidance stop (diffusers' callback) hands the
    UNet batch 2 then batch 1 in one call: the first call compiles two graphs (the CPU test
    tests/test_fewer_calls.py pins the guard that fails), each captured as a CUDA graph under
    reduce-overhead without a skip; later calls compile nothing."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    pipe = sd15(dataclasses.replace(COMPILED, guidance_stop=0.5))
    before = snapshot()
    first = image(pipe)
    assert events_between(before, snapshot())["frames"] == 2
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    before = snapshot()
    again = [image(pipe) for _ in range(2)]
    assert events_between(before, snapshot())["frames"] == 0
    for out in again:
        assert np.abs(out - first).max() < 1e-3


@pytest.mark.parametrize("model", ["sdxl", "pixart"])
def test_cache_and_guidance_stop_add_no_sync_to_the_loop(model):
    plain = fdh.count_syncs(sd15(BF16, model), steps=6)
    recipe = dataclasses.replace(BF16, cache_every=3, guidance_stop=0.5)
    cached = fdh.count_syncs(sd15(recipe, model), steps=6)
    assert cached["in_loop"] <= plain["in_loop"], (plain["where"], cached["where"])


def test_cache_and_guidance_stop_save_time_compiled():
    torch._dynamo.reset()
    settings = dict(steps=30, runs=5, warmup=2, progress=False)
    base = fdh.benchmark(sd15(COMPILED), step="compiled", **settings)
    # FLOPs (count_flops, full-size SD1.5, 31 PNDM calls): cache 0.60 of the denoiser's, guidance
    # stop 0.74; batch 1 uses a GPU less fully than batch 2, so the time saved is asked to be smaller
    for change, most in ((dict(cache_every=3), 0.85), (dict(guidance_stop=0.5), 0.95)):
        recipe = dataclasses.replace(COMPILED, **change)
        result = fdh.benchmark(sd15(recipe), step=str(change), baseline=base, **settings)
        print(result.summary(), f"{base.latency_s / result.latency_s:.2f}x")
        assert not result.compiled_during_timing
        assert result.latency_s < most * base.latency_s
        assert result.flops_per_image < base.flops_per_image
