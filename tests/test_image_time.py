"""fdh.course.image_seconds (course/planning/image_time.py): the one estimate of an image's seconds, resting on
the published and measured figures of course/planning/published.py (issue 51)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning.gpus import PROFILES as GPU_PROFILES
from fastdiff_helpers.course.planning import clock
from fastdiff_helpers.course.planning import image_time as it
from fastdiff_helpers.course.planning.published import OTHER_CARDS, PUBLISHED, SOURCES
from fastdiff_helpers.course.planning.gpus import GpuProfile

ROOT = Path(__file__).resolve().parent.parent
BLOG_MODELS = ("sdxl", "sd15", "ssd1b", "pixart")


def _path_ratio(card, model, path):
    return it.estimate(card, model, path)[0] / it.estimate(card, model, "sdpa")[0]


def _same_source_sdpa(p):
    (base,) = [q for q in PUBLISHED if (q.source, q.card, q.model, q.path) ==
               (p.source, p.card, p.model, "sdpa")]
    return base


@pytest.mark.parametrize("p", [p for p in PUBLISHED if p.role != "context"],
                         ids=lambda p: f"{p.card}-{p.model}-{p.path}-{p.source}")
def test_each_estimate_is_within_1_3x_of_the_figure_it_rests_on(p):
    """An anchor is the estimate (converted to the course's steps by FLOPs); a check is within
    1.3x of it; a ratio figure sets its card's estimate against the other card's. A path other
    than "sdpa" and "fp32" is compared as its ratio to the same source's "sdpa" figure."""
    if p.role == "ratio":
        (other,) = [q for q in PUBLISHED if q.source == p.source and q.model == p.model
                    and q.path == p.path and q.card != p.card]
        got = it.estimate(p.card, p.model, p.path)[0] / it.estimate(other.card, p.model,
                                                                      p.path)[0]
        assert got == pytest.approx(it.course_seconds(p) / it.course_seconds(other))
        return
    if p.path in ("sdpa", "fp32"):  # true fp32 rests on its own figure, not a ratio
        got, want = it.estimate(p.card, p.model, p.path)[0], it.course_seconds(p)
    else:
        got = _path_ratio(p.card, p.model, p.path)
        want = it.course_seconds(p) / it.course_seconds(_same_source_sdpa(p))
    if p.role == "anchor":
        assert got == pytest.approx(want, rel=1e-9)
    else:
        assert 1 / 1.3 <= got / want <= 1.3, (got, want)


def test_the_table_is_well_formed():
    for p in PUBLISHED:
        assert p.source in SOURCES and p.card in tuple(GPU_PROFILES) + tuple(OTHER_CARDS)
        assert p.path in it.PATHS and p.role in ("anchor", "ratio", "check", "context")
        assert p.role != "context" or p.note, p
        quoted = float(re.search(r"[\d.]+", p.quote).group())
        assert quoted / (1000 if p.quote.endswith(" ms") else 1) == pytest.approx(p.figure)
        assert p.unit == "it/s" or p.steps > 0


def test_the_blogs_rows_and_this_projects_h100_are_the_tables():
    """The blog's A100 rows (fdh.course.BLOG_A100_SECONDS, rounded from the CSVs) and the H100's
    medians (results/h100-80gb-hbm3/sdxl/results.jsonl) are the figures the table holds."""
    steps = {"fp32": "tf32", "bf16": "half", "+ SDPA": "sdpa", "+ compile": "compiled"}
    for p in PUBLISHED:
        if p.card == "a100-80" and p.role == "anchor":
            rung = {v: k for k, v in steps.items()}[p.path]
            assert fdh.course.BLOG_A100_SECONDS[p.model][rung] == pytest.approx(p.figure, abs=0.005)
    rows = [json.loads(x) for x in
            (ROOT / "results/h100-80gb-hbm3/sdxl/results.jsonl").read_text().splitlines() if x]
    ours = {(p.path): p.figure for p in PUBLISHED if p.source == "this project's H100"}
    assert {steps[r["step"]]: round(r["latency_s"], 2) for r in rows} == ours


@pytest.mark.parametrize("gpu", list(GPU_PROFILES))
@pytest.mark.parametrize("model", BLOG_MODELS)
def test_never_fp32_faster_than_half_nor_compile_slower_than_eager(gpu, model):
    s = {rung: fdh.course.image_seconds(gpu, model, rung)
         for rung in ("fp32, TF32 off", "+ TF32", "bf16", "+ SDPA", "+ compile")}
    blog_fp32 = fdh.course.image_seconds(gpu, model, "fp32", ladder="blog")
    assert s["fp32, TF32 off"] >= s["+ TF32"] >= s["bf16"] >= s["+ SDPA"] >= s["+ compile"]
    assert blog_fp32 >= s["+ SDPA"]


def test_the_blogs_a100_rows_and_the_h100s_sdxl_rows_within_1_25x():
    for model, row in fdh.course.BLOG_A100_SECONDS.items():
        for rung, seconds in row.items():
            got = fdh.course.image_seconds("a100-80", model, rung, ladder="blog")
            assert 1 / 1.25 <= got / seconds <= 1.25, (model, rung, got, seconds)
    rows = [json.loads(x) for x in
            (ROOT / "results/h100-80gb-hbm3/sdxl/results.jsonl").read_text().splitlines() if x]
    for r in rows:
        got = fdh.course.image_seconds("h100", "sdxl", r["step"], ladder="blog")
        assert 1 / 1.25 <= got / r["latency_s"] <= 1.25, (r["step"], got)


def test_a_small_cards_compile_gain_is_its_own():
    """The T4's SD1.5 gain is the diffusers table's (6.9 -> 7.3 it/s), at most 1.25x; no card
    under the A100 takes a large card's gain."""
    gain = {g: fdh.course.image_seconds(g, "sd15", "+ SDPA") / fdh.course.image_seconds(g, "sd15", "+ compile")
            for g in GPU_PROFILES}
    assert gain["t4"] == pytest.approx(7.3 / 6.9) and gain["t4"] <= 1.25
    for small in ("t4", "l4", "a10g"):
        assert gain[small] <= 1.25 and gain[small] not in (gain["h100"], gain["a100-80"])
        assert "h100" not in it.image_basis(small, "sdxl", "+ compile")


def test_the_clock_asks_it():
    assert clock.image_s("sdxl", "half") == fdh.course.image_seconds("h100", "sdxl", "+ SDPA")
    assert clock.image_s("sd15", "fp32", "t4") == fdh.course.image_seconds("t4", "sd15",
                                                                    "fp32, TF32 off")
    assert clock.image_s("flux", "compiled") == pytest.approx(4.209)  # diffusers-torchao's
    assert clock.image_s("flux", "half", "a100-40") == fdh.course.image_seconds("a100-40", "flux", "bf16",
                                                                         ladder="flux")


def test_size_batch_and_a_card_of_no_profile():
    base = fdh.course.image_seconds("l4", "sdxl", "+ SDPA")
    assert fdh.course.image_seconds("l4", "sdxl", "+ SDPA", size=512, batch=2) == pytest.approx(base / 2)
    other = GpuProfile("other", "RTX 4090", 24, 24 * 10**9, "this GPU", 128, (8, 9), 165.0,
                           82.6)
    assert fdh.course.image_seconds(other, "sdxl", "+ SDPA") < base  # scaled from the nearest profile
    assert "measured" in fdh.course.image_basis("a100-80", "sdxl", "+ compile")
    assert fdh.course.image_basis("l4", "sdxl", "+ SDPA").startswith("scaled")
    assert fdh.course.image_basis("h100", "sdxl", "fp32, TF32 off").startswith("measured")
    assert fdh.course.image_basis("l4", "sdxl", "fp32, TF32 off").startswith("computed")


@pytest.mark.parametrize("call, said", [
    (lambda: fdh.course.image_seconds("v9000", "sdxl", "+ SDPA"), "Unknown GPU 'v9000': use one of t4"),
    (lambda: fdh.course.image_seconds("t4", "sdxl", "+ warp"), "'+ warp' is no step of the course"),
    (lambda: fdh.course.image_seconds("t4", "sdxl", "bf16", ladder="x"), "Unknown ladder 'x'"),
    (lambda: fdh.course.image_seconds("t4", "sdxl", "bf16", size=0), "size=0 cannot work"),
    (lambda: fdh.course.image_seconds("t4", "sdxl", "bf16", size=-1024), "size=-1024 cannot work"),
    (lambda: fdh.course.image_seconds("t4", "sdxl", "bf16", batch=0), "batch=0 cannot work"),
    (lambda: fdh.course.image_seconds("t4", "sdxxl", "bf16"), "Unknown model 'sdxxl'"),
])
def test_bad_input_is_one_clear_line(call, said):
    with pytest.raises(fdh.FastdiffError, match=re.escape(said)) as caught:
        call()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("model", ["sd15", "ssd1b", pytest.param("sdxl", marks=pytest.mark.slow),
                                   pytest.param("pixart", marks=pytest.mark.slow),
                                   pytest.param("flux", marks=pytest.mark.slow)])
def test_the_flops_are_count_flops(model):
    flops = fdh.count_flops(model)
    step, rest = it.FLOPS[model]
    assert flops["denoiser_total"] / flops["steps"] / 1e12 == pytest.approx(step, rel=1e-3)
    assert (flops["per_image"] - flops["denoiser_total"]) / 1e12 == pytest.approx(rest, rel=1e-3)


def test_true_fp32_rests_on_the_h100s_measured_fp32_sdxl():
    """The course ladder's fp32 rung (TF32 off) measured on the H100 is the fp32 anchor, and
    every other card's fp32 runs at the share of its FP32 datasheet rate that one reached."""
    rows = [json.loads(x) for x in (ROOT / "results/h100-80gb-hbm3/sdxl-course/results.jsonl")
            .read_text().splitlines() if x]
    (fp32,) = [r for r in rows if r["step"] == "fp32, TF32 off"]
    assert fdh.course.image_seconds("h100", "sdxl", "fp32, TF32 off") == pytest.approx(
        round(fp32["latency_s"], 2))
    assert it.FP32_SHARE == pytest.approx(
        fdh.count_flops("sdxl")["per_image"] / 1e12 / 12.96 / 67.0, rel=1e-3)
    assert 0.4 < it.FP32_SHARE < 0.55
    for card in ("l4", "a100-40"):  # computed: FLOPs at the share of the card's FP32 rate
        seconds = fdh.course.image_seconds(card, "sdxl", "fp32, TF32 off")
        assert seconds == pytest.approx(it.image_flops("sdxl", 30) / (
            GPU_PROFILES[card].fp32_tflops * it.FP32_SHARE), rel=1e-6)
