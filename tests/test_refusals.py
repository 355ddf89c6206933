"""Every bad input is refused before any slow work (issue 24), with one line that says what to
do, in the words of the interface it came through: one test per class of input (counts, image
sizes, names, devices, dtypes, input paths, output folders and files), each sweeping the
public functions that take it, and one for the command line.

"Before any slow work": a spy records every pipeline built or loaded (build_pipeline,
load_pretrained) and every pipeline call; a refused call must leave both empty."""

from __future__ import annotations


import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs import cli
from fastdiff_helpers.models import loading
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.techniques.recipe import RecipeError
from fastdiff_helpers.course.runs.batch import read_prompts
from fastdiff_helpers.course.reference import save_figure, save_result


@pytest.fixture(scope="module")
def pipe():
    return fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)


@pytest.fixture(scope="module")
def pixart():
    return fdh.load_pipeline("pixart", weights="tiny", device="cpu", verbose=False)


@pytest.fixture
def slow_work(monkeypatch, pipe, pixart):
    """What a refusal must not reach: [('build' | 'pretrained' | 'call', ...)]."""
    seen = []
    real_build = loading.build_pipeline

    def spy_build(*args, **kwargs):
        seen.append(("build", args[0].key))
        return real_build(*args, **kwargs)

    def spy_pretrained(*args, **kwargs):
        seen.append(("pretrained", args[0].key))
        raise AssertionError("no pretrained weights here")

    monkeypatch.setattr(loading, "build_pipeline", spy_build)
    monkeypatch.setattr(loading, "load_pretrained", spy_pretrained)
    for p in (pipe, pixart):
        cls = type(p)
        real_call = cls.__call__

        def spy_call(self, *args, _real=real_call, **kwargs):
            seen.append(("call", type(self).__name__))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", spy_call)
    return seen


def refused(fn, *words, error=FastdiffError):
    """fn() raises `error` with a one-line message holding every word; returns the message."""
    with pytest.raises(error) as caught:
        fn()
    message = str(caught.value)
    assert "\n" not in message.strip(), message
    for word in words:
        assert word in message, (word, message)
    return message


# -- counts ---------------------------------------------------------------------------------

COUNTS = [
    ("benchmark steps=0", lambda p: fdh.benchmark(p, steps=0), "steps=0"),
    ("benchmark steps=-3", lambda p: fdh.benchmark(p, steps=-3), "steps=-3"),
    ("benchmark steps=2.5", lambda p: fdh.benchmark(p, steps=2.5), "steps=2.5"),
    ("benchmark steps=True", lambda p: fdh.benchmark(p, steps=True), "steps=True"),
    ("benchmark runs=0", lambda p: fdh.benchmark(p, runs=0), "runs=0"),
    ("benchmark warmup=-1", lambda p: fdh.benchmark(p, warmup=-1), "warmup=-1"),
    ("benchmark max_runs<runs", lambda p: fdh.benchmark(p, runs=5, max_runs=3), "max_runs=3"),
    ("benchmark seed=-1", lambda p: fdh.benchmark(p, seed=-1), "seed=-1"),
    ("benchmark seed=2**64", lambda p: fdh.benchmark(p, seed=2**64), "below 2**64"),
    ("generate steps=0", lambda p: fdh.generate(p, "x", steps=0), "steps=0"),
    ("generate guidance=nan", lambda p: fdh.generate(p, guidance=float("nan")), "guidance=nan"),
    ("generate prompt=3", lambda p: fdh.generate(p, 3), "prompt=3"),
    ("naive_time runs=0", lambda p: fdh.course.naive_time(p, runs=0), "runs=0"),
    ("call_kwargs steps=0", lambda p: fdh.call_kwargs(p, steps=0), "steps=0"),
    ("graph_breaks steps=0", lambda p: fdh.graph_breaks(p, steps=0), "steps=0"),
    ("count_syncs steps=-1", lambda p: fdh.count_syncs(p, steps=-1), "steps=-1"),
    ("recompile_report steps=0", lambda p: fdh.course.recompile_report(p, [64], steps=0), "steps=0"),
    ("run_ladder steps=0", lambda p: fdh.course.run_ladder("sd15", "tiny", steps=0), "steps=0"),
    ("run_ladder runs=0", lambda p: fdh.course.run_ladder("sd15", "tiny", runs=0), "runs=0"),
    ("run_ladder warmup=-1", lambda p: fdh.course.run_ladder("sd15", "tiny", warmup=-1), "warmup=-1"),
    ("warm_ladder steps=0", lambda p: fdh.course.warm_ladder("sd15", "tiny", steps=0), "steps=0"),
    ("course_settings steps=0", lambda p: fdh.course.settings(steps=0), "steps=0"),
    ("course_settings runs=0", lambda p: fdh.course.settings(runs=0), "runs=0"),
    ("run_batch batch_size=0", lambda p: fdh.course.run_batch(["x"], "out/never", batch_size=0),
     "batch_size=0"),
    ("run_batch steps=0", lambda p: fdh.course.run_batch(["x"], "out/never", steps=0), "steps=0"),
    ("launch_batch processes=0", lambda p: fdh.course.launch_batch(["x"], "out/never", processes=0),
     "processes=0"),
    ("launch_batch threads=0", lambda p: fdh.course.launch_batch(["x"], "out/never", threads=0),
     "threads=0"),
    ("launch_batch an unknown option", lambda p: fdh.course.launch_batch(["x"], "out/never",
                                                                  stepz=2), "stepz"),
    ("count_flops steps=0", lambda p: fdh.count_flops("sd15", steps=0), "steps=0"),
    ("measure_matmul_tflops n=0", lambda p: fdh.measure_matmul_tflops("cpu", n=0), "n=0"),
    ("flop_floor_seconds rate 0", lambda p: fdh.flop_floor_seconds(1e12, 0), "tflops_per_s=0"),
]


@pytest.mark.parametrize("case", COUNTS, ids=[c[0] for c in COUNTS])
def test_counts(case, pipe, slow_work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # out/never is never created
    _, fn, word = case
    refused(lambda: fn(pipe), word)
    assert slow_work == [] and not (tmp_path / "out").exists()


# -- image sizes ----------------------------------------------------------------------------

SIZES = [
    ("benchmark height=100", lambda p, x: fdh.benchmark(p, height=100), "height=100",
     "multiple of 8"),
    ("generate width=0", lambda p, x: fdh.generate(p, width=0), "width=0", "at least 1"),
    ("pixart height=72", lambda p, x: fdh.generate(x, height=72), "height=72", "multiple of 16"),
    ("run_ladder width=30", lambda p, x: fdh.course.run_ladder("sd15", "tiny", width=30), "width=30",
     "24 or 32"),
    ("warm_ladder height=100", lambda p, x: fdh.course.warm_ladder("sd15", "tiny", height=100),
     "height=100", "multiple of 8"),
    ("course_settings resolution=100", lambda p, x: fdh.course.settings(resolution=100),
     "resolution=100", "multiple of 8"),
    ("recompile_report a bad second size", lambda p, x: fdh.course.recompile_report(p, [64, 70]),
     "height=70", "multiple of 8"),
    ("recompile_report sizes=64", lambda p, x: fdh.course.recompile_report(p, 64), "sizes=64",
     "list of sizes"),
    ("count_flops width=12", lambda p, x: fdh.count_flops("sdxl", width=12), "width=12",
     "multiple of 8"),
    ("run_batch height=9", lambda p, x: fdh.course.run_batch(["x"], "out/never", model="sd15",
                                                      height=9), "height=9", "multiple of 8"),
    ("memory_savers_report size=100", lambda p, x: fdh.course.memory_savers_report("sd15", size=100),
     "size=100", "multiple of 8"),
    ("memory_savers_report size=(96, 50)",
     lambda p, x: fdh.course.memory_savers_report("sd15", size=(96, 50)), "width=50", "48 or 56"),
    ("memory_savers_report size=(96,)", lambda p, x: fdh.course.memory_savers_report("sd15", size=(96,)),
     "size=(96,)", "(height, width) pair"),
]


@pytest.mark.parametrize("case", SIZES, ids=[c[0] for c in SIZES])
def test_image_sizes(case, pipe, pixart, slow_work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, fn, *words = case
    refused(lambda: fn(pipe, pixart), *words)
    assert slow_work == []


def test_a_multiple_of_8_that_is_not_one_of_the_unet_blocks_runs(pipe):
    """The rule is the VAE's 8 (times PixArt's patch of 2), not the UNet's depth: diffusers'
    UNet upsamples to the size it saw (forward_upsample_size), so 72 px (a 9x9 latent) runs."""
    assert fdh.generate(fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False),
                        steps=1, height=72, width=72).size == (72, 72)


# -- names ----------------------------------------------------------------------------------

NAMES = [
    ("load_pipeline model", lambda: fdh.load_pipeline("sd3"), "Unknown model 'sd3'", "sdxl"),
    ("load_pipeline weights", lambda: fdh.load_pipeline("sd15", weights="full"),
     "Unknown weights 'full'", "tiny"),
    ("load_pipeline vae", lambda: fdh.load_pipeline("sdxl", weights="tiny", vae="fp32-fix"),
     "Unknown vae", "fp16-fix"),
    ("load_pipeline scheduler", lambda: fdh.load_pipeline("sd15", "tiny", scheduler="ddim"),
     "Unknown scheduler", "dpm-solver"),
    ("run_ladder ladder", lambda: fdh.course.run_ladder("sd15", "tiny", ladder="mine"),
     "Unknown ladder 'mine'", "blog"),
    ("run_ladder steps_filter", lambda: fdh.course.run_ladder("sd15", "tiny", steps_filter=["+ TF32"]),
     "'+ TF32'", "steps_filter=", "'+ SDPA'"),
    ("run_ladder empty steps_filter", lambda: fdh.course.run_ladder("sd15", "tiny", steps_filter=[]),
     "No step", "steps_filter="),
    ("run_ladder fail_step", lambda: fdh.course.run_ladder("sd15", "tiny", fail_step="fp64"),
     "'fp64'", "fail_step="),
    ("course_settings model", lambda: fdh.course.settings("sd2"), "Unknown model 'sd2'"),
    ("course_settings weights", lambda: fdh.course.settings(weights="real"),
     "Unknown weights 'real'"),
    ("run_batch weights", lambda: fdh.course.run_batch(["x"], "out/never", weights="real"),
     "Unknown weights 'real'"),
    ("playground model", lambda: fdh.playground("sd3"), "Unknown model 'sd3'"),
    ("playground weights", lambda: fdh.playground(weights="real"), "Unknown weights 'real'"),
    ("reference_numbers steps", lambda: fdh.course.reference_numbers("sdxl", steps=["fp64"]),
     "'fp64'"),
    ("Recipe field", lambda: fdh.Recipe(compile="fast"), "Unknown compile 'fast'"),
    ("Recipe switch", lambda: fdh.Recipe(channels_last="yes"), "channels_last='yes'"),
]


@pytest.mark.parametrize("case", NAMES, ids=[c[0] for c in NAMES])
def test_names(case, slow_work, tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    monkeypatch.chdir(tmp_path)
    _, fn, *words = case
    refused(fn, *words, error=ValueError)  # FastdiffError and RecipeError are ValueErrors
    assert slow_work == []


def test_technique_names(pipe, slow_work):
    for fn, word in ((lambda: fdh.set_precision(pipe, "int8"), "'int8'"),
                     (lambda: fdh.set_attention(pipe, "flash"), "'flash'"),
                     (lambda: fdh.quantize(pipe, "int4"), "'int4'"),
                     (lambda: fdh.quantize(pipe, "int8-dynamic", "most"), "'most'"),
                     (lambda: fdh.conv1x1_to_linear(pipe, "some"), "'some'"),
                     (lambda: fdh.compile_pipeline(pipe, "fastest"), "'fastest'"),
                     (lambda: fdh.compile_pipeline(pipe, "default", scope="blocks"), "'blocks'"),
                     (lambda: fdh.compile_pipeline(pipe, "default", dynamic="yes"), "'yes'")):
        refused(fn, word, error=RecipeError)
    assert slow_work == [] and fdh.pipeline_info(pipe).applied == {}


# -- devices --------------------------------------------------------------------------------

DEVICES = [
    ("not a device", lambda: fdh.load_pipeline("sd15", "tiny", device="gpu"), "device='gpu'",
     "'cpu', 'cuda'"),
    ("meta without random weights", lambda: fdh.load_pipeline("sd15", "tiny", device="meta"),
     "device='meta'", "weights='random'"),
    ("run_ladder", lambda: fdh.course.run_ladder("sd15", "tiny", device="gpu0"), "device='gpu0'"),
    ("warm_ladder", lambda: fdh.course.warm_ladder("sd15", "tiny", device="tpu"), "device='tpu'"),
    ("run_batch", lambda: fdh.course.run_batch(["x"], "out/never", device="cuda:x"), "device='cuda:x'"),
    ("measure_matmul_tflops", lambda: fdh.measure_matmul_tflops("gpu"), "device='gpu'"),
]
if not torch.cuda.is_available():
    DEVICES += [
        ("cuda on a CPU machine", lambda: fdh.load_pipeline("sd15", "tiny", device="cuda"),
         "device='cuda'", "no CUDA GPU", "device='cpu'"),
        ("cuda:1 on a CPU machine", lambda: fdh.course.run_ladder("sd15", "tiny", device="cuda:1"),
         "no CUDA GPU"),
        ("matmul rate on cuda", lambda: fdh.measure_matmul_tflops("cuda"), "no CUDA GPU"),
    ]


@pytest.mark.parametrize("case", DEVICES, ids=[c[0] for c in DEVICES])
def test_devices(case, slow_work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, fn, *words = case
    refused(fn, *words)
    assert slow_work == []


def test_hardware_choices_follow_the_one_policy(pipe, slow_work):
    """What names hardware this machine lacks is refused, on every path (apply and the
    technique alone); what only needs CUDA graphs is adapted (test_recipe_rules)."""
    for fn in (lambda: fdh.apply(pipe, fdh.Recipe(dtype="bf16", attention="sdpa-flash")),
               lambda: fdh.apply(pipe, fdh.Recipe(dtype="bf16", quantize="fp8-dynamic"))):
        refused(fn, "cpu", error=RecipeError)
    assert slow_work == [] and fdh.pipeline_info(pipe).applied == {}


# -- dtypes ---------------------------------------------------------------------------------

def test_dtypes(pipe, slow_work):
    refused(lambda: fdh.load_pipeline("sd15", "tiny", dtype="fp8"), "Unknown dtype 'fp8'",
            "fp32, bf16, fp16")
    refused(lambda: fdh.load_pipeline("sd15", "tiny", dtype="tf32"), "TF32 is a matmul setting")
    refused(lambda: fdh.load_pipeline("sd15", "tiny", dtype=torch.int8), "torch.int8")
    refused(lambda: fdh.measure_matmul_tflops("cpu", dtype=torch.int8), "dtype=torch.int8")
    refused(lambda: fdh.set_precision(pipe, "fp64"), "'fp64'", error=RecipeError)
    refused(lambda: fdh.Recipe(dtype="fp64"), "'fp64'", error=RecipeError)
    assert slow_work == []


# -- input paths: a path given is a path meant ----------------------------------------------

def test_input_paths(tmp_path, slow_work):
    missing = tmp_path / "nonexistent" / "sdxl"
    # the case: it printed one line and returned the tiny model
    refused(lambda: fdh.load_pipeline("sdxl", path=str(missing)), "path=", str(missing),
            "does not exist", "save_pretrained")
    folder = tmp_path / "empty"
    folder.mkdir()
    refused(lambda: fdh.load_pipeline("sdxl", path=str(folder)), "no model_index.json")
    refused(lambda: fdh.load_pipeline("sdxl", weights="tiny", path=str(folder)),
            "weights='tiny'", "drop one")
    refused(lambda: read_prompts(tmp_path / "prompts.txt"), "prompts=", "does not exist",
            "one prompt per line")
    refused(lambda: read_prompts(tmp_path), "is a folder")
    refused(lambda: read_prompts(42), "prompts=", "list of strings")
    refused(lambda: fdh.course.load_artifacts(tmp_path / "x.fdcache"), "is not a file")
    refused(lambda: fdh.load_results(tmp_path), "is a folder", "results.jsonl")
    with pytest.raises(FileNotFoundError, match="save_results"):
        fdh.load_results(tmp_path / "none.jsonl")
    refused(lambda: fdh.course.reference_results("sdxl", root=tmp_path / "nowhere"), "root=",
            "does not exist")
    refused(lambda: fdh.course.reference_numbers("sdxl", root=tmp_path / "nowhere"), "root=")
    refused(lambda: fdh.course.first_image_in_new_process(tmp_path / "c", load=tmp_path / "no.fdcache"),
            "load=", "does not exist")
    assert slow_work == []


# -- output folders and files ---------------------------------------------------------------

def test_output_folders_and_files(tmp_path, slow_work, pipe):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    result = fdh.Result(model="sd15", weights="tiny", step="x", recipe={}, device_name="cpu",
                        height=64, width=64, steps=2)
    for fn, words in (
            (lambda: fdh.course.run_ladder("sd15", "tiny", out=a_file), ("out=", "is a file")),
            (lambda: fdh.course.warm_ladder("sd15", "tiny", out=tmp_path), ("out=", "is a folder")),
            (lambda: fdh.course.run_batch(["x"], a_file), ("out=", "is a file")),
            (lambda: fdh.course.launch_batch(["x"], a_file / "sub"), ("out=", "is a file")),
            (lambda: fdh.save_results([result], tmp_path), ("path=", "is a folder")),
            (lambda: save_result(result, a_file), ("out=", "is a file")),
            (lambda: fdh.course.use_course_cache(a_file), ("path=", "is a file")),
            (lambda: fdh.course.save_artifacts(tmp_path), ("path=", "is a folder")),
            (lambda: fdh.course.first_image_in_new_process(a_file), ("cache_dir=", "is a file")),
            (lambda: save_figure(fdh.ladder_chart([result]), tmp_path),
             ("path=", "is a folder"))):
        refused(fn, *words)
    assert slow_work == [] and a_file.read_text() == "x"


# -- the command line: the same refusals, in its own words -----------------------------------

CLI = [
    (["bench", "--weights", "tiny", "--height", "100"], ["--height 100", "multiple of 8"]),
    (["bench", "--weights", "tiny", "--model", "pixart", "--width", "72"], ["--width 72", "16"]),
    (["bench", "--weights", "tiny", "--seed", "-1"], ["--seed"]),
    (["ladder", "--weights", "tiny", "--only", "+ TF32", "--device", "cpu"],
     ["'+ TF32'", "--only", "'+ SDPA'"]),
    (["bench", "--weights", "tiny", "--device", "gpu"], ["--device gpu", "is not a device"]),
    (["warm", "--load", "missing.fdcache"], ["missing.fdcache", "is not a file"]),
    (["batch", "--prompts", "missing.txt", "--out", "out/never"],
     ["--prompts missing.txt", "does not exist"]),
    (["bench", "--weights", "pretrained", "--device", "cpu"],
     ["--weights random", "--weights tiny", "hf download"]),
]
if not torch.cuda.is_available():
    CLI.append((["ladder", "--weights", "tiny", "--device", "cuda"],
                ["--device cuda", "no CUDA GPU", "--device cpu", "--weights tiny"]))


@pytest.mark.parametrize("argv, words", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_command_line(argv, words, capsys, slow_work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdiff: error: "), captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "path=" not in lines[0] and "weights=" not in lines[0]  # Python's words, not its own
    assert slow_work == [] and not (tmp_path / "out").exists()


def test_cli_output_paths(capsys, slow_work, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for argv, words in ((["ladder", "--weights", "tiny", "--device", "cpu", "--out", str(a_file)],
                         ["--out", "is a file"]),
                        (["warm", "--weights", "tiny", "--device", "cpu", "--out", str(tmp_path)],
                         ["--out", "is a folder", "sdxl.fdcache"]),
                        (["batch", "--prompts", str(a_file), "--out", str(a_file)],
                         ["--out", "is a file"])):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and all(w in err for w in words), err
    assert slow_work == []
