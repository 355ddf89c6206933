"""What `make demo` says (issue 24): how long it takes here, said first; each step's change
explained from what was measured (its times with their uncertainty, its stages, its profile,
the CPU's measured matmul rates), never a reason written in advance; progress that shows the
time elapsed, never a guessed time left. Synthetic Results: the numbers are the test's."""

from __future__ import annotations

import io

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs import demo
from fastdiff_helpers.measure.timing import progress_bar


def result(step, samples, dtype="bf16", stages=None, ops=None):
    import statistics

    return fdh.Result(model="sdxl", weights="tiny", step=step, recipe={"dtype": dtype},
                      device_name="cpu", height=64, width=64, steps=10,
                      latency_s=statistics.median(samples), latency_samples=samples,
                      stages=stages or {}, ops=ops or {})


FP32 = result("fp32", [0.17, 0.17, 0.18, 0.17, 0.17], "fp32",
              {"denoising": 0.16, "vae_decode": 0.005},
              {"aten::mm": 0.04, "aten::mkldnn_convolution": 0.05})
BF16 = result("bf16", [0.48, 0.47, 0.48, 0.49, 0.48], "bf16",
              {"denoising": 0.33, "vae_decode": 0.14},
              {"aten::mm": 0.05, "aten::_slow_conv2d_forward": 0.25})
SDPA = result("+ SDPA", [0.47, 0.48, 0.50, 0.46, 0.49], "bf16",
              {"denoising": 0.32, "vae_decode": 0.14}, {"aten::mm": 0.05})


def test_a_step_is_explained_by_what_moved_in_its_measurements(monkeypatch):
    monkeypatch.setattr(demo, "cpu_flags", lambda: {"avx2", "fma"})
    said = demo.why(FP32, BF16, "cpu", {"fp32": 173.0, "bf16": 1.2})
    assert said.startswith("bf16: 0.480 s against 0.170 s for fp32 (0.35x, slower)")
    assert "denoising 0.160 -> 0.330 s" in said  # the stage that grew most
    assert "aten::_slow_conv2d_forward moved most (0.000 -> 0.250 s per image)" in said
    assert "1 GFLOP/s in bf16 against 173 in fp32" in said and "no native bf16" in said
    # no canned reason: nothing about quantizing, tensor cores or casts
    assert not any(w in said for w in ("quantize", "convert", "tensor core", "casts"))


def test_a_difference_inside_the_uncertainty_is_not_explained():
    said = demo.why(BF16, SDPA, "cpu")
    assert "within the timing uncertainty: no measurable difference here" in said
    assert "moved most" not in said


def test_native_bf16_is_said_when_the_cpu_has_it(monkeypatch):
    monkeypatch.setattr(demo, "cpu_flags", lambda: {"avx512_bf16", "amx_bf16"})
    said = demo.why(FP32, BF16, "cpu", {"fp32": 400.0, "bf16": 900.0})
    assert "it has amx_bf16, avx512_bf16" in said and "no native" not in said


def test_the_first_lines_say_how_long_it_takes_here_and_why(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "cores", lambda: 2)
    said = demo.before("sdxl", "tiny", "cpu", "blog", 10, tmp_path)
    assert said.index("How long: about 4 minutes here for a first run (2 CPU cores)") > 0
    assert "compiling the 3 compiled steps" in said and str(tmp_path) in said
    assert "a second run takes about 1.5 minutes" in said
    monkeypatch.setattr(demo, "cores", lambda: 8)  # scaled by the cores here
    assert "about 1 minutes here" in demo.before("sdxl", "tiny", "cpu", "blog", 10, tmp_path)
    gpu = demo.before("sdxl", "random", "cuda", "blog", 30)
    # on a GPU: the course clock's estimate, labelled as one, with the graphs it compiles
    # (issue 44: the blog's three compiled steps, a denoiser and a VAE decode each)
    assert "the course clock's estimate" in gpu and "compiling 6 graphs" in gpu
    assert "(the course clock's estimate, docs/workshop.md)" in gpu  # the page with its table
    assert "here for a first run" not in gpu  # the CPU's own figures


def test_after_shows_the_uncertainty_and_the_steps_explained(monkeypatch):
    monkeypatch.setattr(demo, "cpu_flags", lambda: set())
    text = demo.after([FP32, BF16, SDPA], "cpu", None, {"fp32": 173.0, "bf16": 1.2},
                      {"+ compile": 130.0})
    assert "+-" in text.splitlines()[1] and "10 denoising steps, the blog's 30" in text
    assert "compiled ahead, in parallel (+ compile: 130 s)" in text
    assert "  bf16: 0.480 s against 0.170 s" in text and "  + SDPA: 0.480 s" in text
    assert "RE-RUN" not in text.upper()


def test_progress_shows_time_elapsed_and_never_a_time_left():
    out = io.StringIO()
    bar = progress_bar(7, "cold start (compiling)", disable=False, file=out)
    bar.update(1)
    bar.refresh()
    bar.close()
    shown = out.getvalue()
    assert "1/7 calls" in shown and "elapsed" in shown
    assert "<" not in shown and "it/s" not in shown and "s/it" not in shown  # no rate, no ETA


@pytest.mark.alone
def test_the_demo_and_the_playground_measure_the_same_recipe_alike():
    """The same recipe through `make demo`'s path (run_ladder with fdh.course.settings, as
    run_demo calls it) and through the playground, on this machine: the same settings, and
    medians whose intervals overlap (issue 24: bf16 was 0.51x in one and 2.93x in the other)."""
    pytest.importorskip("ipywidgets")
    settings = fdh.course.settings("sdxl", weights="tiny")
    (ladder,) = fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", steps_filter=["fp32"],
                               steps=settings.steps, height=settings.height,
                               width=settings.width, runs=settings.runs,
                               warmup=settings.warmup, max_runs=settings.max_runs,
                               progress=False)
    panel = fdh.playground(device="cpu", settings=settings)
    panel.controls["tf32"].value = "blog"  # the blog's fp32 step: TF32 as diffusion-fast set it
    played = panel.run()
    assert played is not None, panel.error.value
    assert ladder.recipe == played.recipe
    assert (ladder.steps, ladder.height, ladder.runs) == (played.steps, played.height,
                                                         played.runs) == (10, 64, 5)
    # Two medians of one recipe taken one after the other in one process drift apart more than
    # either run's own interval says: on the shared 2-core machine, consecutive ladder/playground
    # pairs measured 0.194/0.172, 0.195/0.164 and 0.164/0.166 s (tiny SDXL fp32, this test's
    # settings), and CI's run on stop 31 0.193/0.171 s (13 %), which failed the old bound of
    # each side's interval, and the full `make test` of issue 52 (67fe455, this machine, the alone
    # phase) 0.270/0.360 s (33 %, the playground's samples climbing from 0.29 to 0.46 s), which
    # failed the next bound, 25 %. What issue 24 found was a factor of 5.7 (bf16 0.51x against
    # 2.93x), from different settings, asserted equal above; so the medians must agree within a
    # factor of 2: it catches that, and not the machine's drift between two runs in a row.
    a, b = ladder.latency_s, played.latency_s
    assert max(a, b) <= 2 * min(a, b), (ladder.latency_samples, played.latency_samples)
