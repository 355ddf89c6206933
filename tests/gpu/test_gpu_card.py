"""GPU checks for issue 46 (any workshop GPU): on whatever card this is, the profile the course
plans with is what torch sees, a bf16 load is the dtype fdh.apply runs, and the estimated peak
(fdh.course.peak_bytes, calibrated on SDXL on one H100) is above the measured one for each model the
course runs in half precision at the size course_settings picks. `pytest tests/gpu -m gpu -k
card`; prints each measured peak against its estimate (the calibration a T4 or L4 slot should
bring back). Skipped without CUDA. Random weights, 2 steps: the peak does not grow with steps."""

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning.sizing import card_fit
from fastdiff_helpers.course.planning.gpus import TEMPLATE_SMS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_profile_is_what_torch_sees():
    profile, props = fdh.course.gpu_profile(), torch.cuda.get_device_properties(0)
    assert profile.capability == (props.major, props.minor)
    assert profile.sms == props.multi_processor_count
    assert profile.total_bytes == props.total_memory
    assert profile.bf16_graphs == torch.cuda.is_bf16_supported(including_emulation=False)
    from torch._inductor.utils import is_big_gpu

    assert profile.gemm_templates == is_big_gpu(0) == (props.multi_processor_count >= TEMPLATE_SMS)


def test_a_bf16_load_is_the_dtype_apply_runs():
    pipe = fdh.load_pipeline("sd15", weights="random", device="cuda", dtype="bf16", verbose=False)
    recipe, _ = fdh.Recipe(dtype="bf16").for_device("cuda")
    assert pipe.unet.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[recipe.dtype]
    del pipe
    fdh.free_memory()


@pytest.mark.parametrize("model", ["sd15", "ssd1b", "sdxl", "pixart"])
def test_the_estimated_peak_is_above_the_measured_one(model):
    profile = fdh.course.gpu_profile()
    size = card_fit(profile, model).size
    if size is None:
        pytest.skip(f"{model} does not fit {profile.name} in {profile.half}")
    estimate = fdh.course.peak_bytes(model, profile.half, size, size)
    pipe = fdh.apply(fdh.load_pipeline(model, weights="random", device="cuda", dtype=profile.half,
                                       verbose=False), fdh.Recipe(dtype=profile.half))
    measured = fdh.peak_memory(pipe, lambda: fdh.generate(pipe, steps=2, height=size, width=size))
    peak = measured["peak_bytes"]
    print(f"{profile.name} {model} {profile.half} {size}px: measured {peak} bytes "
          f"({peak / 2**30:.2f} GiB), estimate {estimate} ({estimate / 2**30:.2f} GiB), "
          f"ratio {peak / estimate:.3f}")
    del pipe, measured
    fdh.free_memory()
    assert peak <= estimate, (model, size, peak, estimate)
