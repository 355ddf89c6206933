import pytest
import torch

from fastdiff_helpers.course.parameters import TINY_STEPS, course_settings, needs_gpu, smoke_mode

# course_settings and needs_gpu read the machine: these two describe a machine without CUDA
cpu_machine = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="describes a machine without a GPU")


def test_smoke_settings_are_tiny_and_short(monkeypatch):
    monkeypatch.setenv("FASTDIFF_SMOKE", "1")
    assert smoke_mode()
    s = course_settings("pixart")
    assert (s.weights, s.device, s.steps, s.height, s.runs, s.warmup) == ("tiny", "cpu", 2, 64, 2, 1)
    # smoke mode proves the code runs: `runs` timed calls, no extra runs to settle a median
    assert s.bench_kwargs() == dict(steps=2, height=64, width=64, runs=2, warmup=1, max_runs=2)
    assert s.ladder_kwargs() == dict(s.bench_kwargs(), weights="tiny", device="cpu")


@pytest.mark.parametrize("value", ["true", "TRUE", " Yes ", "0", "maybe"])
def test_smoke_mode_takes_what_every_switch_takes(monkeypatch, capsys, value):
    """FASTDIFF_SMOKE was read on its own, case-sensitive and silent: "TRUE" was off unsaid."""
    from fastdiff_helpers import checks

    monkeypatch.setattr(checks, "_SAID", set())
    monkeypatch.setenv("FASTDIFF_SMOKE", value)
    assert smoke_mode() is smoke_mode() is checks.env_switch("FASTDIFF_SMOKE", "smoke mode")
    assert smoke_mode() is (value.strip().lower() in checks.SWITCH_ON)
    out = capsys.readouterr().out
    assert out.count("is not a value it takes: smoke mode stays off") == (value == "maybe")


def test_full_settings_use_native_resolution(monkeypatch):
    monkeypatch.delenv("FASTDIFF_SMOKE", raising=False)
    s = course_settings("sd15", weights="random")
    assert (s.weights, s.steps, s.height, s.width, s.runs) == ("random", 30, 512, 512, 5)
    assert s.max_runs is None  # benchmark's own bound: 4 x runs
    assert course_settings("sdxl", weights="random", resolution=768).height == 768


@cpu_machine
def test_auto_is_resolved_once_and_tiny_gets_tiny_size(monkeypatch, tmp_path, capsys):
    import huggingface_hub.constants as hc
    monkeypatch.delenv("FASTDIFF_SMOKE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    s = course_settings("sdxl")  # no GPU, no weights here
    # the CPU story, the same in the notebooks, the playground and `make demo`
    assert (s.weights, s.height, s.steps) == ("tiny", 64, TINY_STEPS) and TINY_STEPS == 10
    assert "weights='tiny'" in capsys.readouterr().out


@cpu_machine
def test_needs_gpu_on_cpu_prints_why(capsys):
    assert needs_gpu("flash attention is a CUDA kernel") is False
    assert "Skipped on this CPU machine" in capsys.readouterr().out
