"""benchmark() and run_ladder() on tiny models on a CPU."""

import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.techniques.precision import set_tf32
from fastdiff_helpers.measure.flops import count_flops
from fastdiff_helpers.measure.bench import benchmark, time_call
from fastdiff_helpers.course.naive import naive_time
from fastdiff_helpers.results.tables import format_table
from fastdiff_helpers.course.runs.ladder import run_ladder
from fastdiff_helpers.models.loading import FastdiffError
from fastdiff_helpers.techniques.recipe import BASELINE
from fastdiff_helpers.course.planning.ladders import LADDER
from fastdiff_helpers.results.store import load_results

ROOT = Path(__file__).resolve().parents[1]
DELAY = 0.05


@pytest.fixture
def pipe():
    return fdh.load_pipeline("sd15", weights="tiny", device="cpu")


@pytest.fixture(autouse=True)
def one_thread():
    # Other processes may share this machine's cores; one intra-op thread keeps the tiny
    # model's time steady (two OpenMP threads spin on each other when a core is taken,
    # which can make a 0.05 s call take seconds).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_result_fields_are_filled_and_consistent(pipe):
    set_tf32("off")  # the baseline's TF32, a process-wide switch an earlier test may have left
    r = benchmark(pipe, steps=2, runs=3, warmup=2, progress=False, max_runs=3)
    assert r.ok and r.model == "sd15" and r.weights == "tiny" and r.step == "custom"
    assert (r.height, r.width, r.steps, r.guidance, r.runs, r.warmup) == (64, 64, 2, 7.5, 3, 2)
    assert len(r.latency_samples) == 3 and r.latency_s == statistics.median(r.latency_samples)
    assert r.cold_start_s > 0
    assert set(r.stages) == {"text_encoding", "denoising", "vae_decode"}
    assert all(len(v) == 3 for v in r.stage_samples.values())
    for i, total in enumerate(r.latency_samples):  # the stages happen inside each call
        assert sum(v[i] for v in r.stage_samples.values()) <= total
    assert r.stages == {k: statistics.median(v) for k, v in r.stage_samples.items()}
    assert r.flops_per_image == count_flops(pipe, steps=2)["per_image"] > 0
    assert r.tflops_per_s is None  # only on a GPU
    assert r.peak_memory_kind == "process_peak_rss" and r.peak_memory_bytes > 2**20
    assert any("process-lifetime" in n for n in r.notes)
    assert r.env["torch"] == torch.__version__ and r.device_name == r.env["cpu"]
    # no recipe applied: recorded as read off the pipeline (diffusers loads SDPA processors)
    assert r.recipe == dict(BASELINE.to_dict(), attention="sdpa") and r.quality is None
    assert r.image.size == (64, 64)
    # the stage wrappers are gone again
    assert "encode_prompt" not in vars(pipe) and "decode" not in vars(pipe.vae)


def _growth(pipe, monkeypatch, steps, delay, calls):
    """(latency growth, stage growths) when each denoiser call waits `delay` s longer."""
    original = pipe.unet.forward

    def delayed(wait):
        def forward(*args, **kwargs):
            calls.append(wait)
            # wait on the clock rather than time.sleep(): a sleeping process hands its core
            # (and caches) to whatever else runs on this machine, slowing the work after it
            end = time.perf_counter() + wait
            while time.perf_counter() < end:
                pass
            return original(*args, **kwargs)
        return forward

    # The reference run already waits DELAY per call, so both runs load a shared machine's
    # cores the same way; only the known extra delay differs.
    monkeypatch.setattr(pipe.unet, "forward", delayed(DELAY))
    before = benchmark(pipe, steps=steps, runs=5, warmup=2, progress=False,
                       max_runs=5)  # the call count below is exact: no settling runs
    monkeypatch.setattr(pipe.unet, "forward", delayed(DELAY + delay))
    after = benchmark(pipe, steps=steps, runs=5, warmup=2, progress=False, max_runs=5)
    monkeypatch.setattr(pipe.unet, "forward", original)
    stages = {k: after.stages[k] - before.stages[k] for k in after.stages}
    return after.latency_s - before.latency_s, stages


@pytest.mark.alone
def test_benchmark_times_a_known_delay(monkeypatch):
    # SDXL's Euler scheduler makes one denoiser call per step (the two guidance halves are
    # one batch); SD1.5's PNDM would make steps + 1.
    pipe = fdh.load_pipeline("sdxl", weights="tiny", device="cpu")
    steps, expected = 4, 4 * DELAY
    failures = []
    for _ in range(3):  # other processes on a shared CPU can disturb one attempt
        calls: list[float] = []
        growth, stages = _growth(pipe, monkeypatch, steps, DELAY, calls)
        assert len(calls) == 2 * steps * (1 + 1 + 5)  # cold start, 1 more warm-up, 5 timed
        checks = [growth == pytest.approx(expected, rel=0.10),
                  stages["denoising"] == pytest.approx(expected, rel=0.10),
                  abs(stages["text_encoding"]) < 0.1 * expected,
                  abs(stages["vae_decode"]) < 0.1 * expected]
        if all(checks):
            return
        failures.append((round(growth, 4), {k: round(v, 4) for k, v in stages.items()}))
    pytest.fail(f"expected +{expected} s in the median and the denoising stage only; "
                f"got {failures}")


def test_same_seed_gives_identical_images_and_psnr_inf(pipe, monkeypatch):
    images = []
    postprocess = pipe.image_processor.postprocess

    def keep(*args, **kwargs):
        out = postprocess(*args, **kwargs)
        images.append(np.asarray(out[0]))
        return out

    monkeypatch.setattr(pipe.image_processor, "postprocess", keep)
    first = benchmark(pipe, steps=2, runs=2, warmup=2, progress=False, max_runs=2)
    assert len(images) == 4  # cold start, one more warm-up, two timed
    assert all(np.array_equal(images[0], im) for im in images[1:])
    again = benchmark(pipe, steps=2, runs=1, warmup=0, progress=False, baseline=first)
    assert again.quality["psnr"] == math.inf and again.quality["ssim"] == pytest.approx(1.0)
    other = benchmark(pipe, steps=2, runs=1, warmup=0, seed=1, progress=False,
                      baseline=first.image)  # a plain image works too
    assert other.seed == 1 and other.quality["psnr"] < 25  # another seed: ~14 dB
    first.image = None  # a Result read back from a file has no image
    with pytest.raises(FastdiffError, match="image_path"):
        benchmark(pipe, steps=2, runs=1, progress=False, baseline=first)


def test_progress_phases(pipe, monkeypatch):
    import tqdm.auto

    bars = []

    class Bar:
        def __init__(self, total, desc, disable, leave, **kwargs):
            self.total, self.descs, self.n, self.closed = total, [desc], 0, False
            self.disable = disable
            bars.append(self)

        def refresh(self):  # tqdm's: benchmark redraws the bar during a long cold start
            pass

        def set_description(self, desc):
            self.descs.append(desc)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    benchmark(pipe, steps=2, runs=3, warmup=3, progress=True, max_runs=3)
    (bar,) = bars
    assert bar.total == bar.n == 1 + 2 + 3 and bar.closed
    assert bar.descs == ["cold start", "warm-up", "timing"]  # "(compiling)" only when compiled
    with pytest.raises(FastdiffError):
        benchmark(pipe, runs=0)


def test_time_call_and_naive_time(pipe):
    out, seconds = time_call(lambda: time.sleep(0.02) or 7, "cpu")
    assert out == 7 and seconds >= 0.02
    assert naive_time(pipe, steps=2, runs=2) > 0


def check_ladder_folder(out, names, model="sd15"):
    """A tiny model's ladder folder: its records in ladder order, the charts, each image, and
    each step's quality against fp32 (test_readme.py checks the README's full ladders with
    it)."""
    stored = load_results(out / "results.jsonl")
    assert [r.step for r in stored] == names
    assert (out / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for r in stored:
        assert r.model == model and r.weights == "tiny" and r.steps == 2
        if r.ok:
            assert (out / r.image_path).is_file()
            # fp32 is the baseline; every later step runs bf16, whose cost on the tiny sd15
            # measures 45-47 dB (bf16 ~46.6, + SDPA ~45.1; int8 on every linear 41-50 in the
            # float images), on the tiny SDXL 47-50 dB (one smoke-mode run, 2026-11-26);
            # noise of a same-math change would be above 100 dB
            if r.step == "fp32":
                assert r.quality["psnr"] == math.inf
            else:
                assert 35 < r.quality["psnr"] < 60, (r.step, r.quality)
    return stored


def _check_ladder_out(out, results, names):
    stored = check_ladder_folder(out, names)
    assert stored == results  # exact round trip (the image is not stored)
    return stored


def test_ladder_isolates_a_failed_step(tmp_path, capsys):
    # the steps without compile (fast); "+ fused QKV" is forced to fail before its compile
    names = ["fp32", "bf16", "+ SDPA", "+ fused QKV"]
    results = run_ladder("sd15", weights="tiny", steps=2, runs=2, warmup=1, out=tmp_path,
                         device="cpu", steps_filter=names, progress=False,
                         fail_step="+ fused QKV")
    stored = _check_ladder_out(tmp_path, results, names)
    assert [r.ok for r in stored] == [True, True, True, False]
    assert stored[3].error.startswith("InjectedFailure: ")
    assert stored[3].recipe == LADDER[4][1].for_device("cpu")[0].to_dict()
    assert stored[0].quality["psnr"] == math.inf  # the baseline against itself
    assert stored[1].recipe["dtype"] == "bf16" and stored[1].quality["psnr"] < math.inf
    assert [r.image_path for r in stored[:3]] == ["images/0_fp32.png", "images/1_bf16.png",
                                                 "images/2_sdpa.png"]
    printed = capsys.readouterr().out
    assert "FAILED: InjectedFailure" in printed and str(tmp_path / "ladder.png") in printed
    table = format_table(stored)
    assert table.splitlines()[0].split()[:2] == ["step", "seconds"] and "identical" in table
    with pytest.raises(FastdiffError, match="Unknown ladder step"):
        run_ladder("sd15", weights="tiny", device="cpu", steps_filter=["fp8"])


def test_a_killed_ladder_leaves_a_loadable_file(tmp_path):
    # Kill the ladder WHILE it runs, as soon as its first record is on disk: the compile
    # steps after it take seconds to a minute on a CPU, so later steps remain. A ladder that
    # wrote its results only at the end fails here: it has started every step (its printed
    # "[6/6]") before the first record appears.
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    printed = tmp_path / "stdout.txt"
    with open(printed, "wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastdiff_helpers", "ladder", "--model", "sd15",
             "--weights", "tiny", "--device", "cpu", "--steps", "2", "--runs", "1",
             "--max-runs", "1", "--warmup", "1", "--out", str(out), "--no-progress"],
            cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.DEVNULL,
            start_new_session=True)  # its own process group: the kill reaches compile workers
    store = out / "results.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if store.exists() and store.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.02)
        running = proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert store.exists(), "the ladder wrote no results.jsonl while it ran"
    assert running and proc.returncode == -signal.SIGKILL, \
        "the ladder ended before its first record was on disk"
    results = load_results(store)
    names = [name for name, _ in LADDER]
    started = re.findall(rf"\[(\d+)/{len(names)}\] sd15 ", printed.read_text())
    assert started and int(started[-1]) < len(names), \
        f"every step had started before the first record was written: {started}"
    assert 1 <= len(results) <= int(started[-1])  # a record only for a step that ran
    assert [r.step for r in results] == names[:len(results)]
    for r, (_, recipe) in zip(results, LADDER):
        assert r.ok, r.error
        assert (r.model, r.weights, r.steps, r.runs, r.warmup) == ("sd15", "tiny", 2, 1, 1)
        assert r.recipe == recipe.for_device("cpu")[0].to_dict()
        assert len(r.latency_samples) == 1 and r.latency_s == r.latency_samples[0] > 0
        assert (out / r.image_path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results[0].quality["psnr"] == math.inf
    assert not (out / "ladder.png").exists()  # the charts come at the end, which never came


def test_benchmark_notes_how_many_linears_were_quantized():
    import fastdiff_helpers as fdh
    pipe = fdh.apply(fdh.load_pipeline("sd15", weights="tiny", device="cpu"),
                     fdh.Recipe(dtype="bf16", attention="sdpa", quantize="int8-dynamic",
                                quant_filter="all"))
    count = fdh.pipeline_info(pipe).applied["quantize"]["linears"]
    assert count > 10
    r = fdh.benchmark(pipe, steps=2, runs=1, warmup=0, progress=False)
    assert f"int8-dynamic: {count} linear layers quantized" in r.notes


@pytest.mark.slow
def test_tiny_ladder_int8_step_quantizes_with_all_and_says_so():
    """The course ladder's own filter selects only linears of the real models' size, none of
    the tiny model's: its int8 step quantizes with 'all' and says so. (The blog's filter is a
    list of excluded shapes: it selects most tiny linears, so the blog ladder keeps it.) On the
    tiny SDXL: in make test the README's course ladder line has compiled this very step into the
    shared cache."""
    from fastdiff_helpers.course.runs.ladder import run_ladder
    (r,) = run_ladder("sdxl", weights="tiny", device="cpu", steps=2, runs=1, warmup=0,
                      steps_filter=["+ int8 dynamic"], progress=False, ladder="course")
    assert r.ok, r.error
    assert r.recipe["quant_filter"] == "all"
    assert r.recipe["compile"] == "default"  # reduce-overhead under the one policy, on a CPU
    assert any("quant_filter='fastdiff' selects no linear" in n for n in r.notes)
    assert any(n.startswith("int8-dynamic: ") and not n.startswith("int8-dynamic: 0 ")
               for n in r.notes)


def test_a_long_cold_start_keeps_the_bar_moving(pipe, monkeypatch):
    import tqdm.auto

    refreshes = []

    class Bar:
        def __init__(self, total, desc, disable, leave, **kwargs):
            self.disable = disable

        def set_description(self, desc):
            pass

        def update(self, n):
            pass

        def refresh(self):
            refreshes.append(time.monotonic())

        def close(self):
            pass

    slow = [True]
    handle = pipe.unet.register_forward_pre_hook(
        lambda *a: time.sleep(0.8) if slow[0] else None)
    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    try:
        benchmark(pipe, steps=2, runs=1, warmup=0, progress=True, max_runs=1)
    finally:
        handle.remove()
    assert len(refreshes) >= 2  # >= 2.4 s of cold start: the clock moved every second


def test_a_listener_hears_the_warm_up_and_may_stop_before_timing(pipe):
    """fdh.benchmark tells "warm" with each untimed call's compile events before it times
    anything; the reference run's refuse_tuned raises there when they
    tuned, and lets an untuned warm-up through."""
    from fastdiff_helpers.models.hooks import listening
    from tools.reference.run import TunedNotMeasured, refuse_tuned

    heard = []

    def listen(event, facts):
        heard.append(event)
        if event == "warm":
            assert len(facts["events"]) == 2 and all("frames" in e for e in facts["events"])
            refuse_tuned(event, facts)  # nothing compiled, nothing tuned: on to timing
            facts["events"][-1].update(autotunes=3, autotune_s=1.5)  # as a compile that tuned
            refuse_tuned(event, facts)

    with listening(listen), pytest.raises(TunedNotMeasured, match=r"tuned \(3 GEMM") as caught:
        benchmark(pipe, steps=2, runs=2, warmup=2, progress=False)
    assert heard == ["benchmark", "warm", "benchmark_end"]  # stopped before any timed call
    assert caught.value.events == {"autotunes": 3, "coordesc_benches": 0, "autotune_s": 1.5}
    assert caught.value.recipe == fdh.current_recipe(pipe)  # what its tuning covers


def test_a_step_stopped_for_its_tuning_is_not_recorded_as_a_failure():
    """The reference run's TunedNotMeasured is a BaseException, as its budget's: measure_step's
    failure isolation (any Exception becomes a failed step's Result) lets it through."""
    from fastdiff_helpers.course.runs.ladder import measure_step
    from fastdiff_helpers.models.hooks import listening
    from fastdiff_helpers.models.presets import get_spec
    from tools.reference.run import TunedNotMeasured

    def stop(event, facts):
        if event == "warm":
            raise TunedNotMeasured("tuned", {"autotunes": 1}, None)

    with listening(stop), pytest.raises(TunedNotMeasured):
        measure_step(get_spec("sd15"), "fp32", BASELINE, "tiny", "cpu", {}, steps=2, runs=1,
                     warmup=1, progress=False)
