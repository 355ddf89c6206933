"""GPU detectors that must see something (issue 13): `pytest tests/gpu -m gpu`.

Skipped without CUDA. A detector that reports nothing proves nothing unless it is shown to
report something where something must be there: timing without synchronisation must come
out SHORTER than with it on a workload the GPU queues faster than it runs (latent output,
so no device-to-host copy of the image synchronises for us), the profiler must name the
pinned SDPA kernel inside the denoiser, and count_syncs must find the syncs no_sync removes."""

import statistics
import time
from collections import Counter

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.measure.bench import time_call

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def sd15(recipe):
    return fdh.apply(fdh.load_pipeline("sd15", weights="random", device="cuda"), recipe)


def test_synchronised_latent_timing_is_longer_than_unsynchronised():
    # A GPU-bound call (SD1.5 at 1024x1024, 4 images: long kernels) with no sync inside
    # (no_sync) and latent output (no copy to the host at the end). Unsynchronised, the clock
    # stops once the last kernel is queued; CUDA queues about a thousand launches, so with
    # one step (one or two UNet calls, one or two thousand kernels) most of the work is still
    # queued then. More steps would shrink that part: keep this workload short and wide.
    pipe = sd15(fdh.Recipe(dtype="bf16", attention="sdpa", no_sync=True))
    kwargs = fdh.call_kwargs(pipe, steps=1, height=1024, width=1024)
    kwargs.update(output_type="latent", num_images_per_prompt=4)

    def call():
        kwargs["generator"] = torch.Generator("cpu").manual_seed(0)
        return pipe(**kwargs).images

    def unsynchronised():
        torch.cuda.synchronize()  # both start from an empty queue
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
        torch.cuda.synchronize()
        return seconds

    latents, _ = time_call(call, "cuda")  # warm-up
    assert latents.device.type == "cuda" and latents.shape[0] == 4  # nothing went to the host
    synced = statistics.median(time_call(call, "cuda")[1] for _ in range(3))
    unsynced = statistics.median(unsynchronised() for _ in range(3))
    assert synced > 1.25 * unsynced, (synced, unsynced)


SDPA_OPS = {"sdpa-flash": "aten::_scaled_dot_product_flash_attention",
            "sdpa-efficient": "aten::_scaled_dot_product_efficient_attention",
            "sdpa-cudnn": "aten::_scaled_dot_product_cudnn_attention",
            "sdpa-math": "aten::_scaled_dot_product_attention_math"}


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("attention", list(SDPA_OPS))
def test_profiler_sees_the_pinned_sdpa_kernel_in_the_denoiser(attention, fuse):
    from diffusers.models.attention_processor import Attention

    pipe = sd15(fdh.Recipe(dtype="bf16", attention=attention, fuse_qkv=fuse))
    args, kwargs = fdh.capture_denoiser_inputs(pipe, steps=2)
    with torch.no_grad(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU,
                        torch.profiler.ProfilerActivity.CUDA]) as prof:
        pipe.unet(*args, **kwargs)
        torch.cuda.synchronize()
    ops = Counter(e.name for e in prof.events()
                  if e.name.startswith("aten::_scaled_dot_product"))
    layers = sum(isinstance(m, Attention) for m in pipe.unet.modules())
    assert layers == 32  # SD1.5: 16 transformer blocks, self- and cross-attention each
    assert ops[SDPA_OPS[attention]] == layers, ops
    assert set(ops) == {SDPA_OPS[attention]}, ops  # no other backend ran


def test_count_syncs_finds_the_loop_syncs_that_no_sync_removes():
    before = fdh.count_syncs(sd15(fdh.Recipe(dtype="bf16", attention="sdpa")), steps=4,
                             verbose=True)
    assert before["in_loop"] > 0 and before["where"], before  # PNDM syncs every step
    after = fdh.count_syncs(sd15(fdh.Recipe(dtype="bf16", attention="sdpa", no_sync=True)),
                            steps=4, verbose=True)
    assert after["in_loop"] == 0, after["where"]
    assert after["total"] < before["total"]
