"""CUDA graphs counted (issue 27, part 2): what runs without a GPU. The counts on a GPU are in
tests/gpu/test_gpu_cudagraphs.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.measure import cudagraphs


def tiny(recipe=None):
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    return fdh.apply(pipe, recipe) if recipe else pipe


def test_report_on_a_cpu_says_none_captured_and_why():
    report = fdh.cudagraph_report(tiny())
    assert report["summary"].startswith("none captured: cpu")
    assert "not compiled" in report["summary"]
    assert report["captures"] == report["replays"] == report["skips"] == 0


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

    before = fdh.cudagraph_snapshot()
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg0_1)")
    events = cudagraphs.cudagraph_events_between(before, fdh.cudagraph_snapshot())
    assert events["skips"] == 1
    assert events["skip_reasons"] == ["skipping cudagraphs due to cpu device (arg0_1)"]
    assert events["captures"] == events["replays"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_no_manager_is_created_where_there_is_no_gpu():
    assert cudagraphs._manager(0) is None
