"""The GPU profiles (issue 46): each capability pinned against the library line that decides it
on the card, with the card's device properties faked; the thresholds the recipe policy uses are
the profiles' own; the memory figures and the estimate behind every fit verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning import gpus
from fastdiff_helpers.models import fit

ROOT = Path(__file__).resolve().parent.parent
PROFILES = list(gpus.PROFILES.values())


def _fake_cuda(monkeypatch, profile):
    props = profile.properties()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: profile.capability)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.key)
def test_bf16_graphs_as_inductor_decides(monkeypatch, profile):
    """compile_fx._check_triton_bf16_support skips a bf16 graph unless
    is_bf16_supported(including_emulation=False): asked here with the card's properties."""
    _fake_cuda(monkeypatch, profile)
    assert torch.cuda.is_bf16_supported(including_emulation=False) is profile.bf16_graphs
    assert profile.half == ("bf16" if profile.bf16_graphs else "fp16")


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.key)
def test_gemm_templates_as_inductor_decides(monkeypatch, profile):
    from torch._inductor import utils

    class Props:
        @staticmethod
        def create(device):
            fake = profile.properties()
            return type("P", (), {"multi_processor_count": fake.multi_processor_count,
                                  "major": fake.major})()

    monkeypatch.setattr(utils, "DeviceProperties", Props)
    monkeypatch.setattr(torch.version, "hip", None)
    assert utils.is_big_gpu.__wrapped__(0) is profile.gemm_templates


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.key)
def test_fp8_as_torchao_decides(monkeypatch, profile):
    torchao_utils = pytest.importorskip("torchao.utils")
    _fake_cuda(monkeypatch, profile)
    assert bool(torchao_utils.is_sm_at_least_89()) is profile.fp8


def test_the_workshop_cards():
    """The issue's cards: T4 (sm75, 40 SMs), L4 (sm89, 58), A10G (sm86, 80), A100 (sm80, 108),
    H100/H200 (sm90, 132); what each can do follows."""
    want = {"t4": ((7, 5), 40), "l4": ((8, 9), 58), "a10g": ((8, 6), 80), "a100-40": ((8, 0), 108),
            "a100-80": ((8, 0), 108), "h100": ((9, 0), 132), "h200": ((9, 0), 132)}
    assert {k: (p.capability, p.sms) for k, p in gpus.PROFILES.items()} == want
    t4, l4, a100 = (gpus.PROFILES[k] for k in ("t4", "l4", "a100-40"))
    assert t4.can() == {"bf16 graphs": False, "flash attention": False, "fp8": False,
                        "GEMM templates": False}
    assert l4.fp8 and not l4.gemm_templates and a100.gemm_templates and not a100.fp8


def test_measured_memory_is_the_results_env():
    for key, folder in (("h100", "h100-80gb-hbm3"), ("h200", "h200")):
        env = (ROOT / "results" / folder / "env.txt").read_text()
        line = next(x for x in env.splitlines() if x.startswith("gpu_memory_bytes"))
        assert gpus.PROFILES[key].total_bytes == int(line.split()[-1])


def test_this_machines_gpu_is_read_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fdh.course.gpu_profile() is None
    t4 = gpus.PROFILES["t4"]
    _fake_cuda(monkeypatch, t4)
    assert fdh.course.gpu_profile() == gpus.from_properties(t4.properties())
    assert fdh.course.gpu_profile().key == "t4" and fdh.course.gpu_profile().sms == 40
    pcie = type("P", (), dict(name="NVIDIA A100 80GB PCIe", major=8, minor=0,
                              total_memory=85_000_000_000, multi_processor_count=108))
    assert gpus.from_properties(pcie).key == "a100-80"
    other = type("P", (), dict(name="NVIDIA GeForce RTX 4090", major=8, minor=9,
                               total_memory=25_000_000_000, multi_processor_count=128))
    assert gpus.from_properties(other).key == "other" and gpus.from_properties(other).fp8
    with pytest.raises(fdh.FastdiffError, match="t4, l4"):
        fdh.course.gpu_profile("v100")


def test_cards_count_gb_as_sold():
    """course/planning/sizing.py CARDS: "16 GB" is 16e9 bytes, not 16 GiB (issue 46)."""
    assert fdh.course.CARDS["16 GB (T4, RTX 4060 Ti 16GB, RTX 4080)"] == pytest.approx(16e9 / 2**30)
    assert all(gib < int(label.split()[0]) for label, gib in fdh.course.CARDS.items())


def test_the_h100s_measured_peaks_are_under_the_estimate():
    """The activations come from measured and published peaks (tests/test_memory_model.py);
    the estimate is above what was measured (the margin), never below."""
    rows = [json.loads(x) for x in
            (ROOT / "results/h100-80gb-hbm3/sdxl/results.jsonl").read_text().splitlines() if x]
    for row in rows:
        assert fit.peak_bytes("sdxl", row["recipe"]["dtype"]) > row["peak_memory_bytes"]


def test_peak_scales_with_pixels_batch_and_the_vae_upcast():
    base = fit.peak_bytes("sdxl", "bf16")
    assert fit.peak_bytes("sdxl", "bf16", 512, 512) < base < fit.peak_bytes("sdxl", "bf16",
                                                                              batch=2)
    # SDXL's VAE decodes in fp32 when the pipeline is fp16 (force_upcast): more than bf16
    assert fit.peak_bytes("sdxl", "fp16") > base
    assert fit.peak_bytes("sd15", "fp16") == fit.peak_bytes("sd15", "bf16")
    assert fit.weight_bytes_of("sdxl", "fp32") == 2 * fit.weight_bytes_of("sdxl", "bf16")
