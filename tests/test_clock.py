"""The course clock (issue 44, item 5): what each notebook compiles and runs on a GPU, counted on
the CPU, and no notebook that starts a tuning on a GPU without the switch or a bundle.

What the smoke runs record is checked against course/planning/clock_record.py by
tests/test_notebooks.py; here: the GPU declarations are tied to the cells that need them, the
notebooks' code is read for any way around the autotune rule, and the estimate is checked on
records made by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fastdiff_helpers as fdh

from fastdiff_helpers.course.planning import clock, clock_gpu
from fastdiff_helpers.course.planning import recorder as clock_log
from fastdiff_helpers.course.planning.clock_gpu import recipe_id
from fastdiff_helpers.course.planning import autotune
from doc_pages import doc_texts

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(path: Path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            yield cell["id"], "".join(cell["source"]), cell.get("metadata", {}).get("tags", [])


PLAIN_COMPILE = re.compile(r"\btorch\.compile\(|\.compile\(|\.compile_repeated_blocks\(")


def test_every_cell_that_does_more_on_a_gpu_is_declared_and_every_declaration_is_a_cell():
    """A cell tagged "gpu", or one that branches on smoke mode or the device, or compiles with
    torch's own call, does on a GPU what its smoke run does not show: its GPU work is declared
    in course/planning/clock_gpu.py (or said to be as recorded). A declared cell id that no notebook
    has is stale."""
    missing, stale = [], []
    for path in NOTEBOOKS:
        declared = clock_gpu.GPU_WORK.get(path.name, {})
        ids = set()
        for cell_id, source, tags in _code_cells(path):
            ids.add(cell_id)
            branches = re.search(r"\bif\b[^\n]*settings\.(smoke|device)\b|\bsettings\.smoke\b",
                                 source)
            # a plain compile (torch.compile, Module.compile, compile_repeated_blocks): the
            # recorder sees its frames, not its recipe, so its GPU work is declared
            branches = branches or PLAIN_COMPILE.search(source)
            if ("gpu" in tags or branches) and cell_id not in declared:
                missing.append(f"{path.name}:{cell_id}")
        stale += [f"{path.name}:{c}" for c in declared if c.split("+")[0] not in ids]
    assert not missing, ("cells whose GPU work fastdiff_helpers/course/planning/clock_gpu.py does not "
                         f"declare: {missing}")
    assert not stale, f"course/planning/clock_gpu.py declares cells that no notebook has: {stale}"
    assert set(clock_gpu.GPU_WORK) <= {p.name for p in NOTEBOOKS}


TUNING_IN_CODE = [
    (re.compile(r"set_autotune\(\s*True"), "switches autotuning on"),
    (re.compile(r"course\.settings\([^)]*autotune\s*=\s*True"), "switches autotuning on"),
    (re.compile(r"FASTDIFF_AUTOTUNE"), "sets the autotuning switch's variable"),
    (re.compile(r"torch\.compile\([^)]*max-autotune"), "calls torch.compile with max-autotune"),
    (re.compile(r"\.compile\([^)]*options\s*="), "compiles with inductor options of its own"),
    (re.compile(r"(inductor_config|_inductor\.config)\.(max_autotune\w*|coordinate_descent\w*)"
                r"\s*="), "sets inductor's tuning options"),
]


def test_no_notebook_starts_a_tuning_on_a_gpu_without_the_switch_or_a_bundle():
    """Every compile through the helpers obeys the autotune rule (course/planning/autotune.py, pinned
    in tests/test_autotune.py); what could go around it is a notebook's own code: switching
    autotuning on, or compiling with tuning by hand. None does. A declared GPU cell that tunes
    runs only with the switch on, and its code checks the switch (or runs a ladder, whose
    autotuning step run_ladder leaves out without it)."""
    found = [f"{path.name}:{cell_id}: {why}" for path in NOTEBOOKS
             for cell_id, source, _ in _code_cells(path)
             for pattern, why in TUNING_IN_CODE if pattern.search(source)]
    assert not found, found
    sources = {(p.name, c): s for p in NOTEBOOKS for c, s, _ in _code_cells(p)}
    unguarded = []
    for notebook, cells in clock_gpu.GPU_WORK.items():
        for cell_id, work in cells.items():
            if not work.get("if_autotune"):
                continue
            source = sources[(notebook, cell_id.split("+")[0])]
            if not re.search(r"autotune_enabled\(\)|settings\.autotune|run_ladder\(", source):
                unguarded.append(f"{notebook}:{cell_id}")
    assert not unguarded, f"tuning cells that do not check the switch: {unguarded}"
    assert any(w.get("if_autotune") for cells in clock_gpu.GPU_WORK.values()
               for w in cells.values())


def test_the_checks_catch_what_they_look_for():
    """The patterns above find what they are for (a test that cannot fail would prove nothing)."""
    bad = ['settings = fdh.course.settings("sdxl", autotune=True)', "fdh.course.set_autotune(True)",
           'pipe.unet = torch.compile(pipe.unet, mode="max-autotune")',
           "torch._inductor.config.coordinate_descent_tuning = True",
           "denoiser.compile(options=options, fullgraph=True)"]
    for line in bad:
        assert any(p.search(line) for p, _ in TUNING_IN_CODE), line
    assert not any(p.search('print(fdh.course.tuning_estimate("sdxl")["words"])')
                   for p, _ in TUNING_IN_CODE)


EVENTS = [{"event": "cell", "id": "a"}, {"event": "load", "model": "sdxl"},
          {"event": "compile", "model": "sdxl", "mode": "reduce-overhead", "scope": "full",
           "vae": True, "tunes": False, "recipe": "r1"},
          {"event": "benchmark", "model": "sdxl", "kind": "compiled", "profile": False},
          {"event": "frame"}, {"event": "frame"}, {"event": "call", "model": "sdxl",
                                                    "kind": "compiled"},
          {"event": "benchmark_end"},
          {"event": "cell", "id": "b"}, {"event": "explain"}, {"event": "frame"},
          {"event": "explain_end"}, {"event": "call", "model": "sdxl", "kind": "half"},
          {"event": "cell", "id": "quiet"}]


def test_a_smoke_run_is_summed_up_per_cell():
    summary = clock.summarize(EVENTS)
    assert set(summary) == {"a", "b"}  # a cell that did nothing is left out
    assert summary["a"] == {"loads": ["sdxl"], "frames": 2, "benchmarks": [
        ["sdxl", "compiled", False]], "calls": [], "compiles": [
        ["sdxl", "reduce-overhead", "full", True, False, "r1"]]}  # its call was the benchmark's
    assert summary["b"] == {"loads": [], "compiles": [], "frames": 0, "benchmarks": [],
                            "calls": [["sdxl", "half"]]}  # graph_breaks' trace is no compile


def test_the_estimate_counts_new_graphs_cache_hits_recompiles_and_tuning(monkeypatch):
    compile_ = ["sdxl", "max-autotune", "full", True, True, "blog"]
    monkeypatch.setattr(clock, "RECORDED", {"x.ipynb": {
        "first": {"loads": ["sdxl"], "compiles": [compile_], "frames": 2,
                  "benchmarks": [["sdxl", "compiled", False]], "calls": []},
        "again": {"loads": ["sdxl"], "compiles": [compile_], "frames": 3, "benchmarks": [],
                  "calls": [["sdxl", "half"]]}}})
    monkeypatch.setattr(clock, "GPU_WORK", {})
    monkeypatch.setattr(clock, "gemm_shapes", lambda model: 42)
    off = clock.estimate()["notebooks"]["x.ipynb"]["cells"]
    unet, vae = clock.ops("sdxl", "denoiser"), clock.ops("sdxl", "vae")
    assert (unet, vae) == (2222, 149)
    assert (off["first"]["graphs"], off["first"]["cache_hits"]) == (2, 0)
    # a new graph costs its ops at the seconds an op SDXL's compile measured on the H200
    # (110.8 s for both graphs, results/h200/slot-2026-11-29.md): the whole figure, here
    assert off["first"]["compile_s"] == pytest.approx(110.8)
    assert off["first"]["tune_s"] == 0  # autotuning off: its default-mode equivalent
    assert off["first"]["load_s"] == clock.FIRST_LOAD_S
    assert off["first"]["images_s"] == pytest.approx(7 * clock.image_s("sdxl", "compiled"))
    # the same recipe again: two cache hits (14.2 s for both on the H200: dynamo traces again,
    # inductor loads) and one recompile, a new graph of the UNet
    assert (off["again"]["graphs"], off["again"]["cache_hits"]) == (1, 2)
    assert off["again"]["compile_s"] == pytest.approx(14.2 + unet * 110.8 / (unet + vae))
    # Flux's transformer keeps its own published figure (67.4 s on an H100)
    assert autotune.graph_seconds("flux", "denoiser") == 67.4
    assert autotune.graph_seconds("flux", "vae") == pytest.approx(148 * 110.8 / (unet + vae))
    assert off["again"]["load_s"] == clock.LOAD_S
    on = clock.estimate(autotune=True)["notebooks"]["x.ipynb"]["cells"]
    assert on["first"]["tune_s"] == pytest.approx(42 * autotune.SHAPE_S)
    assert on["again"]["tune_s"] == 0  # tuned once per model and recipe
    covered = clock.estimate(autotune=True, committed=frozenset({"blog"}))
    assert covered["notebooks"]["x.ipynb"]["tune_s"] == 0  # read from the bundle
    # under 68 SMs no GEMM template tunes
    assert clock.estimate(autotune=True, sms=58)["notebooks"]["x.ipynb"]["tune_s"] == 0


@pytest.mark.slow
def test_the_graph_sizes_are_the_ones_dynamo_counts():
    """The clock's op counts come from tools/graph_ops.py (dynamo on meta copies); a
    count depends a little on what dynamo traced before in the process, so within 10 %."""
    from tools.graph_ops import graph_ops

    assert graph_ops("sd15") == pytest.approx(clock.ops("sd15", "denoiser"), rel=0.1)
    assert graph_ops("sd15", "vae") == pytest.approx(clock.ops("sd15", "vae"), rel=0.1)


def test_images_are_fdh_image_seconds_on_the_clocks_card():
    """The clock's images are the one estimate's (tests/test_image_time.py): on the H100 by
    default, on the card the plan names."""
    assert clock.image_s("sdxl", "half") == pytest.approx(2.30)  # measured on the H100
    assert clock.image_s("flux", "compiled") == pytest.approx(4.209)  # diffusers-torchao's
    assert clock.image_s("sdxl", "compiled", "t4") == fdh.course.image_seconds("t4", "sdxl",
                                                                        "+ compile")


def test_the_recorder_writes_nothing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(clock_log.ENV, raising=False)
    clock_log.record({"event": "call"})
    log = tmp_path / "clock.jsonl"
    monkeypatch.setenv(clock_log.ENV, str(log))
    clock_log.record({"event": "call", "model": "sdxl"})
    assert clock.read_log(log) == [{"event": "call", "model": "sdxl"}]
    assert recipe_id(None) == "compile_pipeline"
    assert recipe_id({"dtype": "bf16", "compile": "reduce-overhead",
                                "compile_vae": True}) == \
        '{"compile": "reduce-overhead", "dtype": "bf16"}'


def test_a_plain_cast_counts_as_the_dtype_it_casts_to():
    """03's technique cell casts a pipeline loaded in fp32 by hand (`pipe.to(torch.bfloat16)`):
    its calls cost what half precision costs, read off the denoiser's weights."""
    import torch

    import fastdiff_helpers as fdh

    pipe = fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False)
    info = fdh.pipeline_info(pipe)
    assert clock_log.kind(info, pipe) == "fp32"
    pipe.to(torch.bfloat16)
    assert clock_log.kind(info, pipe) == "half"
    assert clock_log.kind(info) == "fp32"  # without the pipeline: the dtype it was loaded in


def test_a_denoiser_wrapped_by_torch_compile_is_a_compiled_call():
    """`pipe.unet = torch.compile(pipe.unet)`, the blog's form of 05's technique cell: the
    wrapper has no truth value (OptimizedModule.__len__ raises), and fdh.benchmark asks the
    recorder what kind of call the pipeline makes."""
    from types import SimpleNamespace

    import torch

    pipe = SimpleNamespace(unet=torch.compile(torch.nn.Linear(2, 2)))
    assert clock_log.kind(None, pipe) == "compiled"  # a pipeline the helpers have no record of
    assert clock_log.kind(None, SimpleNamespace(unet=torch.nn.Linear(2, 2))) == "fp32"


def test_the_recorder_counts_every_frame_through_a_dynamo_reset(tmp_path, monkeypatch):
    """torch._dynamo.reset() (fdh.free_memory) clears every compile callback: a compile, a
    reset, a compile again at a new size are two frames, both recorded, once each."""
    import torch

    log = tmp_path / "clock.jsonl"
    monkeypatch.setenv(clock_log.ENV, str(log))
    clock_log.watch_compiles()
    clock_log.watch_compiles()  # asked twice (two loads): still one callback
    double = torch.compile(lambda x: x * 2, backend="eager")
    double(torch.ones(3))
    torch._dynamo.reset()
    double(torch.ones(5))
    torch._dynamo.reset()
    assert clock.read_log(log) == [{"event": "frame"}] * 2
    monkeypatch.delenv(clock_log.ENV)
    double(torch.ones(7))  # recording off: nothing written
    assert clock.read_log(log) == [{"event": "frame"}] * 2


def test_the_readme_table_is_the_clocks():
    """The documentation (the README's page "Preparing a workshop", docs/workshop.md, where the
    table moved in issue 46) shows the course clock's table once, as `python -m fastdiff_helpers
    clock` prints it, from the committed record."""
    header = clock.course_table().splitlines()[0]
    (page,) = [text for _, text in doc_texts() if header in text]
    assert clock.course_table() in page


def test_a_refresh_from_one_notebooks_log_keeps_the_others(tmp_path):
    """tools/clock_refresh.py after one notebook's smoke run rewrites that notebook's record and keeps
    the rest; a notebook that is gone loses its record."""
    from fastdiff_helpers.course.planning import clock_record
    from tools.clock_refresh import refresh

    logs, folder = tmp_path / "logs", tmp_path / "notebooks"
    logs.mkdir()
    folder.mkdir()
    for name in ("00_setup.ipynb", "01_baseline.ipynb"):
        (folder / name).write_text("{}")
    (logs / "00_setup.jsonl").write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
    target = tmp_path / "record.py"
    refresh(logs, target, notebooks=folder)
    namespace: dict = {}
    exec(target.read_text(), namespace)
    assert namespace["RECORDED"]["00_setup.ipynb"] == clock.summarize(EVENTS)
    assert namespace["RECORDED"]["01_baseline.ipynb"] == \
        clock_record.RECORDED["01_baseline.ipynb"]
    assert set(namespace["RECORDED"]) == {"00_setup.ipynb", "01_baseline.ipynb"}


def test_sync_removal_is_a_cache_hit_where_nothing_moves(monkeypatch):
    """Issue 61: on the H200, SDXL's '+ no sync' after '+ fused QKV' compiled in 14.2 s, a cache
    hit (its scheduler keeps the schedule on the CPU already: nothing moves). SD1.5's PNDM
    schedule moves, so there no_sync is a recipe of new graphs."""
    def record(model):
        fused = json.dumps({"compile": "reduce-overhead", "fuse_qkv": True}, sort_keys=True)
        no_sync = json.dumps({"compile": "reduce-overhead", "fuse_qkv": True, "no_sync": True},
                             sort_keys=True)
        return {f"{model}.ipynb": {
            "fused": {"loads": [model], "compiles": [[model, "reduce-overhead", "full", True,
                                                      False, fused]], "frames": 2,
                      "benchmarks": [], "calls": []},
            "no-sync": {"loads": [model], "compiles": [[model, "reduce-overhead", "full", True,
                                                        False, no_sync]], "frames": 2,
                        "benchmarks": [], "calls": []}}}

    monkeypatch.setattr(clock, "GPU_WORK", {})
    monkeypatch.setattr(clock, "RECORDED", {**record("sdxl"), **record("sd15")})
    run = clock.estimate()["notebooks"]
    sdxl, sd15 = run["sdxl.ipynb"]["cells"]["no-sync"], run["sd15.ipynb"]["cells"]["no-sync"]
    assert (sdxl["graphs"], sdxl["cache_hits"]) == (0, 2)
    assert sdxl["compile_s"] == pytest.approx(14.2)
    assert (sd15["graphs"], sd15["cache_hits"]) == (1, 1)  # the UNet new, the VAE decode a hit
