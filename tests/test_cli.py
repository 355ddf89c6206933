"""The command line: python -m fastdiff_helpers ladder | bench | env."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastdiff_helpers.course.runs.cli import main
from fastdiff_helpers.results.store import load_results

ROOT = Path(__file__).resolve().parents[1]


def test_env_prints_the_torch_version():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "fastdiff_helpers", "env"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout and "diffusers:" in proc.stdout


@pytest.mark.parametrize("argv, words", [
    (["bench", "--dtype", "fp8"], ["--dtype", "fp8"]),
    (["ladder", "--model", "sd3"], ["--model", "sd3"]),
    (["bench", "--dynamic", "maybe"], ["--dynamic"]),
    (["bench", "--runs", "0"], ["--runs"]),
    (["ladder", "--fail-step", "fp8"], ["--fail-step"]),
    (["bench", "--fuse-qkv"], ["fuse_qkv", "sdpa"]),  # a RecipeError, before any loading
    (["bench", "--weights", "tiny", "--device", "nonsense"], ["--device"]),
    (["frobnicate"], ["frobnicate"]),
    ([], ["command"]),
])
def test_invalid_input_exits_2_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdiff: error: ")
    assert all(w in lines[0] for w in words) and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.fixture
def one_thread():
    # see tests/test_bench.py: two OpenMP threads crawl when another process takes a core
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_bench_writes_one_record(tmp_path, capsys, one_thread):
    argv = ["bench", "--model", "sd15", "--weights", "tiny", "--device", "cpu", "--steps", "2",
            "--runs", "2", "--warmup", "1", "--dtype", "bf16", "--attention", "sdpa",
            "--out", str(tmp_path), "--step", "bf16 sdpa", "--no-progress",
            "--max-runs", "2"]  # the sample count below is exact: no settling runs
    assert main(argv) == 0
    (result,) = load_results(tmp_path / "results.jsonl")
    assert result.ok and result.step == "bf16 sdpa" and len(result.latency_samples) == 2
    assert result.recipe["dtype"] == "bf16" and result.recipe["attention"] == "sdpa"
    assert result.steps == 2 and (tmp_path / result.image_path).is_file()
    assert "sd15 bf16 sdpa:" in capsys.readouterr().out
    assert main(argv) == 0  # a second run appends
    assert [r.image_path for r in load_results(tmp_path / "results.jsonl")] == [
        "images/0_bf16-sdpa.png", "images/1_bf16-sdpa.png"]


def test_ladder_explain_says_what_runs_compares_with_the_blog_and_points_on(tmp_path, capsys):
    from fastdiff_helpers.course.runs import demo

    code = main(["ladder", "--model", "sdxl", "--weights", "tiny", "--device", "cpu", "--explain",
                 "--only", "fp32", "--only", "bf16", "--steps", "2", "--runs", "3",
                 "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.index("no CUDA GPU") < out.index("[1/2] sdxl fp32")  # said first
    assert "say nothing about GPU speed-ups" in out
    assert "blog A100 (s)" in out and "7.360" in out and "4.630    1.59x" in out
    assert out.count("note: peak memory is the process-lifetime peak RSS") == 1
    assert out.rstrip().endswith("open notebooks/00_setup.ipynb (docs/workshop.md: how to reach "
                                 "JupyterLab on a remote machine).")
    assert f"This run is in {tmp_path}" in out
    # each step explained from what was measured: its stage, its profile, this CPU's rates
    (line,) = [l for l in out.splitlines() if l.startswith("  bf16: ")]
    assert "against" in line and "for fp32" in line
    if "no measurable difference" not in line:
        assert "moved most" in line and "GFLOP/s in bf16" in line
        native = demo.cpu_flags() & {"avx512_bf16", "amx_bf16"}
        assert ("no native bf16" in line) != bool(native)
