"""The course sized for the card (issue 46): one policy that course_settings, fdh.apply's recipe
adaptation, the load check and `plan` share, checked on the CPU against each profile (the
card's properties and free memory faked)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs.cli import main
from fastdiff_helpers.course.planning import sizing
from fastdiff_helpers.course.planning import gpus
from fastdiff_helpers.models import fit
from fastdiff_helpers.course.planning import plan as plan_mod
from fastdiff_helpers.course.planning import clock

T4, L4, A100, H100 = (gpus.PROFILES[k] for k in ("t4", "l4", "a100-40", "h100"))
COURSE = dict(fdh.course.COURSE_LADDER)


def test_bf16_runs_as_fp16_below_sm80_and_says_why():
    recipe, notes = COURSE["+ compile"].for_device("cuda", T4.capability)
    assert recipe.dtype == "fp16" and recipe.compile == COURSE["+ compile"].compile
    assert "_check_triton_bf16_support" in notes[-1]
    assert COURSE["+ compile"].for_device("cuda", A100.capability) == (COURSE["+ compile"], [])
    # on a CPU nothing is swapped (the tiny model's bf16 runs eager there, by design)
    assert COURSE["bf16"].for_device("cpu")[0].dtype == "bf16"


def test_flash_attention_refused_below_sm80():
    recipe = fdh.Recipe(dtype="fp16", attention="sdpa-flash")
    with pytest.raises(fdh.RecipeError, match="check_flash_attention_hardware_support"):
        recipe.check_device("cuda", T4.capability)
    recipe.check_device("cuda", A100.capability)


def test_rung_verdicts_per_card():
    """What each card does with the course's ladder, before anything loads."""
    def verdicts(profile):
        return {name: sizing.rung_verdict(profile, "sdxl", r)[0] for name, r in COURSE.items()}

    t4 = verdicts(T4)
    assert t4["fp32, TF32 off"] == "skipped" and t4["+ compile"] == "swapped"
    assert t4["+ fp8 dynamic"] == "skipped" and t4["+ int8 dynamic"] == "swapped"
    assert set(verdicts(H100).values()) == {"runs"}
    a100 = verdicts(A100)
    assert a100["+ fp8 dynamic"] == a100["+ autotune"] == "skipped"
    assert {v for k, v in a100.items() if "fp8" not in k and "autotune" not in k} == {"runs"}
    status, _, why = sizing.rung_verdict(T4, "sdxl", COURSE["fp32, TF32 off"])
    assert "does not fit Tesla T4" in why[0]
    # under 68 SMs the autotuning step says that max-autotune tunes no GEMM template there
    status, _, why = sizing.rung_verdict(L4, "sdxl", COURSE["+ autotune"])
    assert status == "runs" and any("is_big_gpu" in w for w in why)
    assert not any("is_big_gpu" in w for w in sizing.rung_verdict(H100, "sdxl",
                                                                  COURSE["+ autotune"])[2])


def test_card_fit_sizes_runs_and_batch():
    t4, h100 = sizing.card_fit(T4, "sdxl"), sizing.card_fit(H100, "sdxl")
    assert t4.size == h100.size == 1024 and t4.half == "fp16" and h100.half == "bf16"
    assert not t4.fp32_fits and h100.fp32_fits
    assert h100.runs == 5 and h100.warmup == 2 and t4.runs < h100.runs and t4.warmup == 1
    assert h100.max_batch > t4.max_batch >= 1
    assert fit.peak_bytes("sdxl", "fp16", 1024, 1024, t4.max_batch) <= T4.total_bytes
    assert fit.peak_bytes("sdxl", "fp16", 1024, 1024, t4.max_batch + 1) > T4.total_bytes
    flux = sizing.card_fit(L4, "flux")
    assert flux.size is None and "does not fit" in flux.line(L4, "flux", 28)


def _fake_gpu(monkeypatch, profile, free=None):
    props = profile.properties()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: profile.capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda *a, **k: (profile.total_bytes if free is None else free,
                                         profile.total_bytes))


def test_course_settings_on_a_t4_says_its_sizing(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FASTDIFF_WEIGHTS_FILE", str(tmp_path / "weights.json"))
    _fake_gpu(monkeypatch, T4)
    monkeypatch.setattr("fastdiff_helpers.course.parameters.import_course_tuning", lambda t: [])
    settings = fdh.course.settings("sdxl", weights="random", smoke=False)
    said = capsys.readouterr().out
    assert "sized for Tesla T4" in said and "fp32 does not fit: the baseline runs in fp16" in said
    assert (settings.device, settings.gpu, settings.height) == ("cuda", "t4", 1024)
    assert settings.runs == sizing.card_fit(T4, "sdxl").runs < 5 and settings.warmup == 1
    kept = fdh.course.settings("sdxl", weights="random", smoke=False, runs=7, resolution=768)
    assert (kept.runs, kept.height) == (7, 768)
    # the baseline in the card's half precision, and an fp32-weights rung skipped with the reason
    assert settings.baseline == dataclasses.replace(fdh.Recipe(), dtype="fp16")
    assert settings.baseline.weight_dtype == "fp16"
    capsys.readouterr()
    why = settings.skip(fdh.Recipe(dtype="tf32"))
    assert "sdxl in fp32 does not fit Tesla T4" in why and why in capsys.readouterr().out
    assert settings.skip(fdh.Recipe(dtype="bf16")) is None  # runs, as fp16
    assert "fp8" in settings.skip(fdh.Recipe(dtype="bf16", quantize="fp8-dynamic-row"))
    tiny = fdh.course.settings("sdxl", weights="tiny", smoke=False)  # a GPU, tiny weights
    assert tiny.device == "cuda" and tiny.skip(fdh.Recipe(dtype="tf32")) is None
    assert "fp8" in tiny.skip(fdh.Recipe(dtype="bf16", quantize="fp8-dynamic-row"))
    _fake_gpu(monkeypatch, H100)
    h100 = fdh.course.settings("sdxl", weights="random", smoke=False)
    assert h100.baseline == fdh.Recipe() and h100.skip(fdh.Recipe(dtype="tf32")) is None
    assert "fp32 fits" in capsys.readouterr().out


def test_off_a_gpu_the_baseline_is_fp32_and_nothing_is_skipped():
    cpu = fdh.course.settings("sdxl", smoke=True)
    assert cpu.baseline == fdh.Recipe()
    assert cpu.skip(fdh.Recipe(dtype="tf32")) is None
    assert cpu.skip(fdh.Recipe(quantize="fp8-dynamic-row", dtype="bf16")) is None


def test_a_load_that_cannot_fit_is_refused_before_loading(monkeypatch):
    _fake_gpu(monkeypatch, A100, free=A100.total_bytes - 30 * 2**30)  # a pipeline still alive
    with pytest.raises(fdh.FastdiffError, match="del pipe; fdh.free_memory"):
        fit.check_fits("flux", "bf16", "cuda")
    _fake_gpu(monkeypatch, A100)
    fit.check_fits("flux", "bf16", "cuda")
    _fake_gpu(monkeypatch, T4)
    with pytest.raises(fdh.FastdiffError, match="Nothing was loaded"):
        fit.check_fits("sdxl", "fp32", "cuda")


def test_the_plan_decides_as_the_notebooks_do():
    """plan() asks rung_verdict and fits, the functions the notebooks' paths call: a notebook
    whose every model fits runs; fp8 lessons are skipped below sm89; 19 does not fit an L4."""
    rows = {r["notebook"][:2]: r for r in plan_mod.plan(L4, ["13_autotuning.ipynb",
                                                            "15_fp8_hopper.ipynb",
                                                            "19_flux.ipynb"])}
    assert rows["19"]["verdict"] == "skipped" and "does not fit NVIDIA L4" in rows["19"]["skipped"][0]
    assert rows["15"]["verdict"] == "runs" and rows["15"]["minutes"] > 0
    assert any("is_big_gpu" in n for n in rows["13"]["notes"])
    a100 = plan_mod.plan(A100, ["15_fp8_hopper.ipynb"])[0]
    assert a100["verdict"] == "partly skipped" and any("fp8" in s for s in a100["skipped"])


def test_plan_command(capsys):
    assert main(["plan", "--gpu", "t4", "--notebooks", "01", "07"]) == 0
    out = capsys.readouterr().out
    assert "Plan for Tesla T4" in out and "| 01_baseline | partly skipped [1] |" in out
    assert re.search(r"sdxl fp32 [\d.]+ of 14.8 GiB; sdxl fp16 [\d.]+ of", out)  # the baseline's
    assert "| 07_gpu_syncs | swapped" in out and "sdxl in fp32 does not fit Tesla T4" in out
    assert "a notebook's baseline (settings.baseline) runs in fp16" in out
    assert main(["plan", "--gpu", "t4", "--notebooks", "99"]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_cells_that_run_bf16_on_a_gpu_are_planned_in_half_precision():
    """14, 09 and 11 choose bf16 on a GPU and fp32 on a CPU, so their smoke record says fp32:
    the clock and the plan count that work as a GPU runs it (clock_gpu.as_recorded(half=True)),
    and on a T4 nothing of theirs is fp32, so nothing is skipped for fp32's memory."""
    names = ["14_lora_hotswap.ipynb", "09_fewer_denoiser_calls.ipynb", "11_fitting_your_gpu.ipynb"]
    for row in plan_mod.plan(T4, names):
        assert row["verdict"] == "swapped", row
        assert not any(cell.split()[1] == "fp32" for cell in row["fit"]), row
    work = dict(clock.cell_work("09_fewer_denoiser_calls.ipynb"))
    assert work["nb12-05"]["benchmarks"] == [["sdxl", "half", False]]
    assert work["nb12-13"]["benchmarks"] == [["sdxl", "half", False]]  # (no trace call since 59)
    [compile_] = work["nb12-15"]["compiles"]
    assert json.loads(compile_[-1])["dtype"] == "bf16" and json.loads(compile_[-1])["cache_every"]
    assert dict(clock.cell_work("17_all_models.ipynb"))["nb08-05"]["benchmarks"][0][1] == "fp32"


def test_sizes_that_fit_the_card(capsys):
    """05's dynamic-shape cell asks for 1x, 1.5x and 2x the native size: a T4 keeps 1024 only,
    saying what it left out; an H100 keeps all three."""
    assert sizing.fitting_sizes(T4, "sdxl", [1024, 1536, 2048]) == [1024]
    assert "left out on Tesla T4: 1536x1536" in capsys.readouterr().out
    assert sizing.fitting_sizes(H100, "sdxl", [1024, 1536, 2048]) == [1024, 1536, 2048]
    cpu = fdh.course.settings("sdxl", smoke=True)
    assert cpu.sizes_that_fit([64, 4096]) == [64, 4096]


def test_readme_and_workshop_page_show_the_plan_as_it_is():
    """The README's one row per card and docs/workshop.md's T4 plan are the command's output
    on this checkout (regenerate: plan --summary, plan --gpu t4)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert plan_mod.plan_summary() in (root / "README.md").read_text()
    assert plan_mod.plan_table("t4") in (root / "docs" / "workshop.md").read_text()


def test_the_plan_counts_only_what_runs_and_all_of_it():
    """A skipped notebook adds no wait (19 on a T4); a partly skipped one counts its running
    parts: a ladder's fp32 step that does not fit is refused before it loads, a notebook's fp32
    baseline runs in half precision, a refused fp8 compile costs nothing (issue 51)."""
    t4 = {r["notebook"][:2]: r for r in plan_mod.plan(T4, ["01_baseline.ipynb",
                                                           "17_all_models.ipynb",
                                                           "19_flux.ipynb"])}
    assert t4["19"]["verdict"] == "skipped" and t4["19"]["minutes"] == 0
    assert t4["17"]["minutes"] > 0 and t4["01"]["minutes"] > 0
    ladder = dict(plan_mod.card_work(T4, "17_all_models.ipynb"))["nb08-05"]
    recorded = dict(clock.cell_work("17_all_models.ipynb"))["nb08-05"]
    assert ["sdxl", "fp32", False] in recorded["benchmarks"]
    assert ["sdxl", "fp32", False] not in ladder["benchmarks"]
    assert len(ladder["loads"]) == len(recorded["loads"]) - 1
    assert ladder["benchmarks"] == recorded["benchmarks"][1:]  # SSD-1B's fp32 fits (below)
    ssd1b = dict(plan_mod.card_work(T4, "17_all_models.ipynb"))["nb08-09"]
    assert ssd1b == dict(clock.cell_work("17_all_models.ipynb"))["nb08-09"]
    baseline = dict(plan_mod.card_work(T4, "01_baseline.ipynb"))["nb01-09"]
    assert baseline["benchmarks"] == [["sdxl", "half", False]]
    fp8 = dict(plan_mod.card_work(A100, "15_fp8_hopper.ipynb"))["nb15-12"]
    whole = dict(clock.cell_work("15_fp8_hopper.ipynb"))["nb15-12"]
    assert len(fp8["compiles"]) == len(whole["compiles"]) - 1
    assert fp8["frames"] == whole["frames"] - 2 and len(fp8["loads"]) == len(whole["loads"]) - 1
    # the estimate asks the card's images: the same work is slower on a T4 than on an H100
    work = {"x": dict(clock.cell_work("01_baseline.ipynb"))["nb01-09"]}
    assert (clock.estimate(works={"x": [("c", work["x"])]}, gpu="t4")["total_s"]
            > clock.estimate(works={"x": [("c", work["x"])]}, gpu="h100")["total_s"])
