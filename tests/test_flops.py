"""FLOPs from the architecture, checked against shared/notes/facts.md (counted on meta copies)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fastdiff_helpers as fdh
from fastdiff_helpers.measure.flops import count_flops, flop_floor_seconds, measure_matmul_tflops

TERA = 1e12


@pytest.fixture(scope="module")
def meta_pipes():
    return {m: fdh.load_pipeline(m, weights="random", device="meta")
            for m in ("sdxl", "sd15", "pixart")}


def test_full_size_flops_match_published(meta_pipes):
    # facts.md, batch 1 (guidance=1 turns classifier-free guidance off), attention included
    sdxl = count_flops(meta_pipes["sdxl"], guidance=1.0)
    sd15 = count_flops(meta_pipes["sd15"], guidance=1.0)
    pixart = count_flops(meta_pipes["pixart"], guidance=1.0)
    assert sdxl["batch"] == sd15["batch"] == pixart["batch"] == 1
    assert (sdxl["height"], sd15["height"], pixart["height"]) == (1024, 512, 1024)
    assert sdxl["denoiser_per_forward"] / TERA == pytest.approx(6.761, rel=0.01)
    assert sd15["denoiser_per_forward"] / TERA == pytest.approx(0.803, rel=0.01)
    assert pixart["denoiser_per_forward"] / TERA == pytest.approx(6.510, rel=0.01)
    assert sdxl["vae_decode"] / TERA == pytest.approx(10.47, rel=0.01)
    assert pixart["vae_decode"] / TERA == pytest.approx(10.47, rel=0.01)
    assert sd15["vae_decode"] / TERA == pytest.approx(2.51, rel=0.01)
    assert pixart["text_encoders"] / TERA == pytest.approx(1.117, rel=0.01)  # T5-XXL, 120 tokens


def test_guidance_doubles_the_batch_and_per_image_adds_up(meta_pipes):
    one = count_flops(meta_pipes["sd15"], guidance=1.0, steps=30)
    cfg = count_flops(meta_pipes["sd15"], steps=30)  # SD1.5 default guidance 7.5
    assert cfg["batch"] == 2 and cfg["steps"] == 30
    assert cfg["denoiser_per_forward"] == pytest.approx(2 * one["denoiser_per_forward"], rel=1e-3)
    # SD1.5 encodes the empty negative prompt too: two text encoder passes
    assert cfg["text_encoders"] == 2 * one["text_encoders"]
    # SD1.5's own scheduler, PNDM with skip_prk_steps, sets 31 timesteps for 30 steps
    # (scheduling_pndm.py:213) and the pipeline calls the UNet once per timestep
    assert cfg["calls"] == 31
    assert cfg["per_image"] == (31 * cfg["denoiser_per_forward"] + cfg["vae_decode"]
                                + cfg["text_encoders"])
    # SDXL uses zeros for an empty negative prompt (force_zeros_for_empty_prompt): one pass
    sdxl_cfg, sdxl_one = (count_flops(meta_pipes["sdxl"], guidance=g) for g in (None, 1.0))
    assert sdxl_cfg["text_encoders"] == sdxl_one["text_encoders"]


def test_model_key_counts_like_the_meta_pipeline(meta_pipes):
    for model in ("sdxl", "sd15", "pixart"):
        assert count_flops(model) == count_flops(meta_pipes[model])


def test_flop_floor_from_the_architecture():
    # facts.md: 30 steps with guidance + VAE decode at ~790 TFLOP/s (dense bf16, H100/H200)
    assert flop_floor_seconds(count_flops("sdxl"), 790) == pytest.approx(0.527, rel=0.01)
    assert flop_floor_seconds(count_flops("sd15"), 790) == pytest.approx(0.066, rel=0.01)
    pixart = count_flops("pixart")["per_image"]  # a plain FLOP count works too
    assert flop_floor_seconds(pixart, 790) == pytest.approx(0.510, rel=0.01)
    with pytest.raises(ValueError):
        flop_floor_seconds(1e12, 0)


def _real_count(module, *args, **kwargs):
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*args, **kwargs)
    return counter.get_total_flops()


def test_classic_and_sdpa_attention_count_the_same():
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    from fastdiff_helpers.measure.flops import _meta_copy, _module_key

    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu")
    counted = count_flops(pipe, guidance=1.0)["denoiser_per_forward"]
    meta = _meta_copy(_module_key(pipe.unet))
    margs = (torch.empty(1, 4, 8, 8, device="meta"), torch.empty(1, device="meta"),
             torch.empty(1, 77, 32, device="meta"))
    meta.set_attn_processor(AttnProcessor())  # baddbmm + softmax + bmm
    classic = _real_count(meta, *margs)
    meta.set_attn_processor(AttnProcessor2_0())  # scaled_dot_product_attention
    sdpa = _real_count(meta, *margs)
    assert classic == sdpa == counted > 0
    # the real CPU module with the classic processor counts the same as the meta copy
    # (on a CPU, FlopCounterMode has no formula for SDPA's CPU flash kernel: one reason the
    # count runs on meta copies, where SDPA decomposes into counted matmuls)
    pipe.unet.set_attn_processor(AttnProcessor())
    args = (torch.randn(1, 4, 8, 8), torch.tensor([10]), torch.randn(1, 77, 32))
    assert _real_count(pipe.unet, *args) == counted


def test_tiny_pipelines_and_other_dtypes_count():
    for model in ("sdxl", "ssd1b", "pixart"):
        pipe = fdh.load_pipeline(model, weights="tiny", device="cpu", dtype="bf16")
        flops = count_flops(pipe, steps=2)
        parts = flops["denoiser_per_forward"], flops["vae_decode"], flops["text_encoders"]
        assert flops["per_image"] == 2 * parts[0] + parts[1] + parts[2] and min(parts) > 0


def test_matmul_rate():
    assert measure_matmul_tflops("cpu", n=256) > 0
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cpu'"):
            measure_matmul_tflops("cuda")


def test_count_flops_counts_every_call_the_scheduler_makes():
    """One denoiser call per timestep the scheduler sets, observed by a hook on the UNet: PNDM
    (SD1.5's own) makes steps + 1, DPM-Solver++ steps, Heun (second order) 2 * steps - 1.
    Before, count_flops counted `steps` calls whatever the scheduler: SD1.5 1/31 short."""
    from diffusers import HeunDiscreteScheduler

    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    seen = []
    pipe.unet.register_forward_pre_hook(lambda m, args: seen.append(1))

    def observed():
        seen.clear()
        fdh.generate(pipe, "a photo", steps=3, seed=0)
        return len(seen)

    flops = count_flops(pipe, steps=3)
    assert observed() == flops["calls"] == 4 and flops["steps"] == 3
    assert flops["denoiser_total"] == 4 * flops["denoiser_per_forward"]
    fdh.set_scheduler(pipe, "dpm-solver")
    assert observed() == count_flops(pipe, steps=3)["calls"] == 3
    pipe.scheduler = HeunDiscreteScheduler.from_config(pipe.scheduler.config)
    assert observed() == count_flops(pipe, steps=3)["calls"] == 5


def test_count_flops_takes_a_model_spec_as_it_takes_its_key():
    """count_flops reads a ModelSpec as a key; a second, later lookup once took it for a
    pipeline and refused ("ModelSpec is not one of the course's pipelines")."""
    assert count_flops(fdh.MODELS["sd15"]) == count_flops("sd15")
    assert count_flops(fdh.MODELS["sd15"])["calls"] == 31
