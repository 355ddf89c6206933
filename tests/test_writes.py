"""Every writer writes inside the folder it was given (or its documented default) and nowhere
else, and never over a file it did not make (issue 35).

Each case runs one writer in a sandbox: the current folder, HOME and the course's compile cache
(FASTDIFF_CACHE_DIR) all inside tmp_path, with a README.md and a results/README.md of someone
else's in the current folder. Every file created or changed anywhere under tmp_path must lie in
the folder the writer was given (or the cache, its documented default); then the same writer is
pointed at a file or a folder it did not make and must refuse, leaving it as it was.
Tiny model, one or two steps, the session's pipelines; the ladder and the reference run use a
stand-in for the measurement (the writing is what is under test)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image

import fastdiff_helpers as fdh
import fastdiff_helpers.course.runs.ladder as ladder_mod
import tools.reference.run as ref
from tools.reference import folder as reference_folder
from fastdiff_helpers.course.compiletime import bundle as bundle_format, cold_start
from fastdiff_helpers.course.reference import save_figure, save_result
from fastdiff_helpers.course.compiletime.watch import TuningWatch
from fastdiff_helpers.results.store import Result
from fastdiff_helpers.course.runs import demo
from fastdiff_helpers.course.runs.cli import main
from fastdiff_helpers.course.runs.launch import launch_batch
from fastdiff_helpers.techniques.lora import LORA_FILE
from fastdiff_helpers.course.planning.tuning_state import STATE

THEIRS = "a file the writer did not make\n"


@pytest.fixture
def box(tmp_path, monkeypatch):
    """cwd, HOME and the compile cache inside tmp_path; files of someone else's in the cwd."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    (cwd / "results").mkdir(parents=True)
    home.mkdir()
    (cwd / "README.md").write_text(THEIRS)
    (cwd / "results" / "README.md").write_text(THEIRS)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FASTDIFF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("FASTDIFF_SMOKE", raising=False)
    yield tmp_path
    STATE.reset()


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


class Watch:
    """What a writer created or changed under the sandbox, against the folders it may use."""

    def __init__(self, root: Path):
        self.root, self.before = root, _files(root)

    def written(self) -> list[Path]:
        after = _files(self.root)
        return sorted(p for p, stat in after.items() if self.before.get(p) != stat)

    def only_in(self, *allowed: Path) -> list[Path]:
        written = self.written()
        outside = [p for p in written if not any(p == a or a in p.parents for a in allowed)]
        assert not outside, f"written outside {allowed}: {outside}"
        assert (self.root / "cwd" / "README.md").read_text() == THEIRS
        return written


def _result(step: str = "fp32", value: int = 100) -> Result:
    r = Result(model="sdxl", weights="tiny", step=step, recipe=fdh.Recipe().to_dict(),
               device_name="cpu", height=8, width=8, steps=1, latency_s=1.0,
               latency_samples=[1.0], cold_start_s=1.0, peak_memory_bytes=1,
               env={"torch": "2.13.0+cpu", "device": "cpu"})
    r.image = Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8))
    return r


def _theirs(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(THEIRS)
    return path


def _refused(call, path: Path, match: str = "is left as it is|did not write|holds"):
    with pytest.raises((fdh.FastdiffError, ValueError), match=match):
        call()
    assert path.read_text() == THEIRS


# --- the results store, charts, traces --------------------------------------------------------

def test_save_results_appends_only_to_a_results_file(box):
    watch = Watch(box)
    fdh.save_results([_result()], "out/run.jsonl")
    fdh.save_results([_result("bf16")], "out/run.jsonl")
    assert [r.step for r in fdh.load_results("out/run.jsonl")] == ["fp32", "bf16"]
    watch.only_in(box / "cwd" / "out" / "run.jsonl")
    # a text file without its last newline was cut to its last line before (_repair_tail)
    notes = box / "cwd" / "notes.txt"
    notes.write_text(THEIRS.rstrip("\n"))
    with pytest.raises(fdh.FastdiffError, match="is not a results file"):
        fdh.save_results([_result()], notes)
    assert notes.read_text() == THEIRS.rstrip("\n")
    _refused(lambda: fdh.save_results([_result()], "README.md"), box / "cwd" / "README.md")
    _refused(lambda: reference_folder.rewrite_results([_result()], "README.md"),
             box / "cwd" / "README.md")


def test_save_result_keeps_its_folder_and_never_writes_over_an_image(box):
    watch = Watch(box)
    save_result(_result(value=10), "out/run", 0)
    save_result(_result(value=20), "out/run", 0)  # a second run, same index
    records = fdh.load_results("out/run/results.jsonl")
    assert [r.image_path for r in records] == ["images/0_fp32.png", "images/0_fp32-2.png"]
    assert [int(np.asarray(Image.open(Path("out/run") / r.image_path))[0, 0, 0])
            for r in records] == [10, 20]  # each record keeps its own image
    watch.only_in(box / "cwd" / "out" / "run")
    _theirs(box / "cwd" / "mine" / "notes.txt")
    _refused(lambda: save_result(_result(), "mine"),
             box / "cwd" / "mine" / "notes.txt")
    assert sorted(p.name for p in (box / "cwd" / "mine").iterdir()) == ["notes.txt"]


def test_save_figure_replaces_only_a_matplotlib_png(box):
    matplotlib.use("Agg")
    watch = Watch(box)
    fig = fdh.ladder_chart([_result()])
    save_figure(fig, "out/ladder.png")
    save_figure(fig, "out/ladder.png")  # its own chart: replaced
    watch.only_in(box / "cwd" / "out" / "ladder.png")
    _refused(lambda: save_figure(fig, "README.md"), box / "cwd" / "README.md")
    Image.new("RGB", (4, 4)).save("photo.png")  # a PNG, but not a chart matplotlib wrote
    before = Path("photo.png").read_bytes()
    with pytest.raises(fdh.FastdiffError, match="not a PNG chart that matplotlib wrote"):
        save_figure(fig, "photo.png")
    assert Path("photo.png").read_bytes() == before


def test_profile_writes_its_trace_and_only_over_a_trace(box, tiny_pipes):
    pipe = tiny_pipes["sd15"]
    watch = Watch(box)
    fdh.profile(pipe, "a photo", steps=1, warmup=0, runs=1, trace="out/trace.json")
    assert json.loads(Path("out/trace.json").read_text())["traceEvents"]
    fdh.profile(pipe, "a photo", steps=1, warmup=0, runs=1, trace="out/trace.json")
    watch.only_in(box / "cwd" / "out" / "trace.json")
    _theirs(box / "cwd" / "notes.json")
    _refused(lambda: fdh.profile(pipe, "a photo", steps=1, warmup=0, runs=1,
                                 trace="notes.json"), box / "cwd" / "notes.json")


# --- compile caches, artifacts and tuning bundles ---------------------------------------------

def test_the_course_cache_is_the_one_folder_it_makes(box):
    watch = Watch(box)
    folder = fdh.course.use_course_cache(verbose=False)
    assert folder == box / "cache"
    (folder / "probe").write_text("x")
    watch.only_in(box / "cache")


def test_compile_artifacts_are_written_only_over_an_artifact_file(box):
    _theirs(box / "cwd" / "sdxl.fdcache")
    _refused(lambda: fdh.course.save_artifacts("sdxl.fdcache"), box / "cwd" / "sdxl.fdcache")
    assert main(["warm", "--weights", "tiny", "--device", "cpu", "--steps", "1",
                 "--out", "sdxl.fdcache"]) == 2  # before anything is loaded
    assert Path("sdxl.fdcache").read_text() == THEIRS
    with pytest.raises(fdh.FastdiffError, match="not a fastdiff compile-cache file"):
        fdh.course.load_artifacts("sdxl.fdcache")  # read, never written
    Path("ours.fdcache").write_bytes(cold_start.MAGIC + b"{}\n")
    assert cold_start.check_artifacts_path("path", "ours.fdcache") == Path("ours.fdcache")


def _tuned_cache(box: Path) -> Path:
    """The course cache with one GEMM block of timings, as max-autotune leaves it."""
    cache = fdh.course.use_course_cache(verbose=False)
    timings = cache / "cache" / bundle_format.tuning_stamp()["system_hash"]
    timings.parent.mkdir(parents=True, exist_ok=True)
    timings.write_text(json.dumps({"cache": {"mm": {"[k]": {"high": {"aten": 1.0}}}}}))
    return cache


def test_tuning_bundles_go_where_they_are_told_and_import_into_the_cache(box, capsys):
    cache = _tuned_cache(box)
    watch = Watch(box)
    fdh.course.export_tuning("out/sdxl.json.gz", model="sdxl")
    watch.only_in(box / "cwd" / "out" / "sdxl.json.gz")
    assert main(["tuning", "export", "--out", "README.md"]) == 2
    assert "is not a tuning bundle" in capsys.readouterr().err
    _refused(lambda: fdh.course.export_tuning("README.md"), box / "cwd" / "README.md")
    bare = box / "bare"
    watch = Watch(box)
    fdh.course.import_tuning("out/sdxl.json.gz", cache_dir=bare)
    assert main(["tuning", "import", "out/sdxl.json.gz"]) == 0
    assert main(["tuning", "import", "--matching", str(box / "cwd")]) == 0
    watch.only_in(bare, cache)


def test_a_tuning_watch_writes_its_bundle_and_progress_and_refuses_others(box):
    _tuned_cache(box)
    bundle = box / "cwd" / "out" / "t" / "sdxl.json.gz"
    watch = Watch(box)
    with TuningWatch(bundle, "sdxl", command="test", every_s=3600):
        pass
    assert json.loads(gzip.decompress(bundle.read_bytes()))["model"] == "sdxl"
    watch.only_in(bundle.parent)
    _theirs(box / "cwd" / "x.json.gz")
    _refused(lambda: TuningWatch(box / "cwd" / "x.json.gz"), box / "cwd" / "x.json.gz")
    _theirs(box / "cwd" / "y.progress.json")
    _refused(lambda: TuningWatch(box / "cwd" / "y.json.gz"), box / "cwd" / "y.progress.json")


def test_the_demo_compiles_ahead_without_writing_tuning_into_the_current_folder(monkeypatch):
    """`warm` keeps its tuning under --tuning-root (default results/ of the current folder):
    the demo's processes compiling ahead must not, as they wrote outside its --out."""
    commands = []

    class Done:
        returncode, stdout = 0, None

        def __init__(self, command, **kw):
            commands.append(command)

        def poll(self):
            return 0
    monkeypatch.setattr(demo.subprocess, "Popen", Done)
    demo.precompile("sdxl", "tiny", "cpu", "blog", progress=False)
    assert len(commands) == 3 and all("--no-tuning" in c for c in commands)


# --- the ladder, the reference run, the demo, bench -------------------------------------------

def _fake_step(spec, name, recipe, weights, device, loading, baseline=None, **kw):
    r = _result(name, 100 + [n for n, _ in fdh.course.LADDER].index(name))
    if baseline is not None:
        r.quality = fdh.compare_images(r.image, baseline)
    r.wall_s = 0.0
    return r


def test_run_ladder_writes_in_its_folder_only(box, monkeypatch):
    monkeypatch.setattr(ladder_mod, "measure_step", _fake_step)
    watch = Watch(box)
    fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", out="out/ladder", progress=False,
                   steps_filter=["fp32", "bf16"])
    fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", out="out/ladder", progress=False,
                   steps_filter=["fp32"])  # appended: its image beside the first run's
    written = watch.only_in(box / "cwd" / "out" / "ladder")
    assert {p.name for p in written} >= {"results.jsonl", "0_fp32.png", "0_fp32-2.png",
                                         "1_bf16.png", "ladder.png", "memory.png"}
    _theirs(box / "cwd" / "mine" / "notes.txt")
    _refused(lambda: fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", out="mine"),
             box / "cwd" / "mine" / "notes.txt")
    assert main(["ladder", "--weights", "tiny", "--device", "cpu", "--out", "mine"]) == 2
    assert main(["bench", "--weights", "tiny", "--device", "cpu", "--out", "mine"]) == 2
    assert main(["demo", "--weights", "tiny", "--device", "cpu", "--out", "mine"]) == 2
    assert sorted(p.name for p in (box / "cwd" / "mine").iterdir()) == ["notes.txt"]
    _theirs(box / "cwd" / "charts" / "ladder.png")  # refused before the work, not after it
    _refused(lambda: fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", out="charts"),
             box / "cwd" / "charts" / "ladder.png")


@pytest.fixture
def fake_reference(monkeypatch):
    monkeypatch.setattr(ref, "measure_step", _fake_step)
    monkeypatch.setattr(reference_folder, "measure_matmul_tflops", lambda device: 0.5)


def test_the_reference_run_writes_only_its_folder_unless_it_is_under_results(box,
                                                                            fake_reference):
    """Its README table went to the grandparent of --out: `--out out/ref` rewrote ./README.md
    (the checkout's, run from there). Outside results/<gpu>/<model> the folder keeps
    everything; under it, results/README.md must be new or the reference run's own."""
    watch = Watch(box)
    outcome = ref.run_reference("sdxl", out="out/ref", weights="tiny", device="cpu",
                                progress=False)
    assert outcome.status == "complete"
    watch.only_in(box / "cwd" / "out" / "ref")
    _refused(lambda: ref.run_reference("sdxl", weights="tiny", device="cpu", progress=False),
             box / "cwd" / "results" / "README.md", "a results table that the reference run")
    assert sorted(p.name for p in (box / "cwd" / "results").iterdir()) == ["README.md"]
    _theirs(box / "cwd" / "results" / "x" / "sdxl" / "results.jsonl").write_text("")
    _refused(lambda: ref.write_results_readme("results"), box / "cwd" / "results" / "README.md",
             "a results table that the reference run")
    (box / "cwd" / "results" / "x" / "sdxl" / "results.jsonl").unlink()
    Path("results/README.md").unlink()
    watch = Watch(box)
    ref.run_reference("sdxl", out="results/cpu/sdxl", weights="tiny", device="cpu",
                      progress=False)
    watch.only_in(box / "cwd" / "results")
    again = Path("results/README.md").read_text()
    assert again.startswith("# Reference results") and "| fp32 |" in again
    _theirs(box / "cwd" / "other" / "notes.txt")
    _refused(lambda: ref.run_reference("sdxl", out="other", weights="tiny", device="cpu"),
             box / "cwd" / "other" / "notes.txt")


# --- batch, LoRA files --------------------------------------------------------------------------

def test_batch_writes_in_its_folder_and_never_over_a_prompts_file(box):
    watch = Watch(box)
    summary = fdh.course.run_batch(["a red fox"], "out/job", model="sd15", weights="tiny",
                            device="cpu", steps=1, height=64, width=64, warmup=0)
    assert summary["done"] == 1
    watch.only_in(box / "cwd" / "out" / "job")
    _theirs(box / "cwd" / "mine" / "notes.txt")
    _refused(lambda: fdh.course.run_batch(["a red fox"], "mine", weights="tiny", device="cpu"),
             box / "cwd" / "mine" / "notes.txt")
    _theirs(box / "cwd" / "out" / "job2" / "prompts.txt")
    _refused(lambda: launch_batch(["a red fox"], "out/job2", processes=1, weights="tiny",
                                          device="cpu"),
             box / "cwd" / "out" / "job2" / "prompts.txt", "holds other prompts")


def test_a_lora_file_is_made_in_its_folder_and_never_over_another(box, tiny_pipes):
    pipe = tiny_pipes["sd15"]
    watch = Watch(box)
    first = fdh.course.make_lora_file(pipe, "out/lora", rank=2, seed=1)
    fdh.course.make_lora_file(pipe, "out/lora", rank=2, seed=1)  # the same file again: left as it is
    watch.only_in(box / "cwd" / "out" / "lora")
    assert [p.name for p in first.iterdir()] == [LORA_FILE]
    data = (first / LORA_FILE).read_bytes()
    with pytest.raises(fdh.FastdiffError, match="holds another LoRA"):
        fdh.course.make_lora_file(pipe, "out/lora", rank=2, seed=2)
    assert (first / LORA_FILE).read_bytes() == data
    _theirs(box / "cwd" / "mine" / "notes.txt")
    _refused(lambda: fdh.course.make_lora_file(pipe, "mine"), box / "cwd" / "mine" / "notes.txt")


def test_a_folder_this_user_cannot_write_is_refused_in_one_wording(tmp_path, monkeypatch):
    """A run's folder that exists, the folder a new one or a new file would go in: each refused
    when this user cannot write there, before anything is written, in the same words (root
    passes every os.access, so the check is made to answer no)."""
    import os
    import re

    from fastdiff_helpers.checks import output_file
    from fastdiff_helpers.course.planning.writes import output_folder

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    said = "{} is not writable here; give a folder you can write to."
    for check, name, path in ((output_folder, "out", tmp_path),
                              (output_folder, "out", tmp_path / "new"),
                              (output_file, "path", tmp_path / "results.jsonl")):
        with pytest.raises(fdh.FastdiffError,
                           match=re.escape(f"{name}={str(path)!r}: " + said.format(tmp_path))):
            check(name, path)
    assert list(tmp_path.iterdir()) == []
