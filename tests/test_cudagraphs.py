"""CUDA graphs counted (issue 27, part 2): what runs without a GPU. The counts on a GPU are in
tests/gpu/test_gpu_cudagraphs.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import fastdiff_helpers as fdh
from conftest import eager_compiled_block
from fastdiff_helpers.measure import cudagraphs
from fastdiff_helpers.measure.compile_events import recompile_reasons


def tiny(recipe=None):
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    return fdh.apply(pipe, recipe) if recipe else pipe


def test_report_on_a_cpu_says_none_captured_and_why():
    report = fdh.cudagraph_report(tiny())
    assert report["summary"].startswith("none captured: cpu")
    assert "not compiled" in report["summary"]
    assert report["captures"] == report["replays"] == report["skips"] == 0


def test_a_report_over_a_call_runs_it_once_and_takes_no_since_beside_it():
    """As fdh.peak_memory takes its call: the report counts what the call did (12's cell, and
    docs/helpers.md), so the snapshot a lesson took by hand stays inside the helper."""
    pipe, ran = tiny(), []
    report = fdh.cudagraph_report(pipe, call=lambda: ran.append(fdh.generate(pipe, steps=1)))
    assert len(ran) == 1 and ran[0] is not None
    assert report["summary"].startswith("none captured: cpu") and report["captures"] == 0
    with pytest.raises(fdh.FastdiffError, match="a call or a since, not both"):
        fdh.cudagraph_report(pipe, call=lambda: None, since=cudagraphs.cudagraph_snapshot())
    assert len(ran) == 1


def test_benchmark_records_the_report_beside_the_compile_events():
    torch._dynamo.reset()
    pipe = tiny(fdh.Recipe(attention="sdpa", compile="max-autotune", compile_vae=False))
    result = fdh.benchmark(pipe, steps=2, runs=1, warmup=0, progress=False)
    graphs = result.compile_events["cudagraphs"]
    # the one policy ran max-autotune without its CUDA graphs on a CPU, and says so
    assert graphs["summary"].startswith("none captured: cpu")
    assert "'max-autotune-no-cudagraphs' ran without them" in graphs["summary"]
    assert graphs["captures"] == 0 and graphs["skip_reasons"] == []
    json.dumps(result.to_dict())  # kept in the record as plain data


def test_a_plain_torch_compile_is_read_off_the_pipeline():
    """07's technique cell compiles with torch's own call (`pipe.unet = torch.compile(...)`,
    an OptimizedModule in place of the UNet): the report reads the mode off it, and the
    clock's kind of call sees a compiled pipeline (an OptimizedModule has no truth value).
    Nothing is called, so nothing compiles."""
    from fastdiff_helpers.course.planning import recorder as clock_log

    pipe = tiny()
    pipe.unet = torch.compile(pipe.unet, mode="reduce-overhead", fullgraph=True)
    summary = fdh.cudagraph_report(pipe)["summary"]
    assert summary.startswith("none captured: cpu")
    assert "compile='reduce-overhead' ran without them" in summary
    assert clock_log.kind(fdh.pipeline_info(pipe), pipe) == "compiled"
    assert fdh.current_recipe(pipe)["compile"] == "reduce-overhead"


def _node(**children):
    return SimpleNamespace(children=children)


def test_tree_counts_read_captures_and_rerecords_from_the_trees():
    """The shape of CUDAGraphTreeManager.roots (torch/_inductor/cudagraph_trees.py): function
    id -> recorded nodes; each node's children the same. A second node for a function under
    the same parent is a re-record (a new shape, a new parameter...)."""
    unet_step = _node(vae=[_node()])
    roots = {"unet": [unet_step, _node()], "text": [_node(unet=[_node(), _node(), _node()])]}
    assert cudagraphs.tree_counts(roots) == (7, 3)  # 2 + 1 + 1 + 3 nodes
    assert cudagraphs.tree_counts({}) == (0, 0) and cudagraphs.tree_counts(None) == (0, 0)


def test_a_skip_is_counted_with_the_reason_torch_logs():
    """torch's own skip path (cudagraph_utils.log_cudagraph_skip_and_bump_counter): the
    counter it bumps and the message it logs both reach the snapshot."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    before = cudagraphs.cudagraph_snapshot()
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg0_1)")
    events = cudagraphs.cudagraph_events_between(before, cudagraphs.cudagraph_snapshot())
    assert events["skips"] == 1
    assert events["skip_reasons"] == ["skipping cudagraphs due to cpu device (arg0_1)"]
    assert events["captures"] == events["replays"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_no_manager_is_created_where_there_is_no_gpu():
    assert cudagraphs._manager(0) is None


def _frames_and_reasons(call):
    from fastdiff_helpers.measure.compile_events import events_between, snapshot

    seen = {k: len(v) for k, v in recompile_reasons().items()}
    before = snapshot()
    call()
    reasons = [r for k, v in recompile_reasons().items() for r in v[seen.get(k, 0):]]
    return events_between(before, snapshot())["frames"], reasons


def test_a_parameter_copy_with_requires_grad_flipped_recompiles_and_so_does_a_lora(tmp_path):
    """07's re-record cell and tests/gpu's re-record test swap a weight for a copy. The
    pipelines hold their parameters with requires_grad=True, and dynamo guards each
    parameter's requires_grad: a copy made with requires_grad=False recompiles ("requires_grad
    mismatch"), a new capture under a new compiled function, not a re-record. A copy with the
    same requires_grad compiles nothing: on a GPU only its new address re-records the graph.
    Loading a LoRA (07, 08) wraps the targeted layers in peft's LoRA layers, new modules: the
    guards fail and the next call compiles again. One transformer block of the tiny SD1.5's
    UNet, compiled by dynamo alone (backend="eager": the guards and recompiles are dynamo's,
    whatever the backend), keeps this to seconds."""
    torch._dynamo.reset()
    pipe = tiny()
    assert all(p.requires_grad for p in pipe.unet.parameters())
    block = pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0]
    call = eager_compiled_block(block)
    call()  # the compile
    to_q = block.attn1.to_q
    to_q.weight = torch.nn.Parameter(to_q.weight.detach().clone(),
                                     requires_grad=to_q.weight.requires_grad)
    assert _frames_and_reasons(call) == (0, [])
    to_q.weight = torch.nn.Parameter(to_q.weight.detach().clone(), requires_grad=False)
    frames, reasons = _frames_and_reasons(call)
    assert frames == 1 and any("requires_grad mismatch" in r for r in reasons), reasons
    fdh.load_lora(pipe, fdh.course.make_lora_file(pipe, tmp_path / "lora", rank=2))
    assert type(block.attn1.to_q).__module__.startswith("peft")  # wrapped by peft
    frames, reasons = _frames_and_reasons(call)
    assert frames == 1 and reasons, reasons
