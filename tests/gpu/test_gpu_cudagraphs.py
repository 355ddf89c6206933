"""CUDA graphs counted (issue 27, part 2), on a CUDA GPU: `pytest tests/gpu/test_gpu_cudagraphs.py
-m gpu -s`. Full-size SD1.5 with random weights at 512x512, 2 steps (the UNet alone compiled:
its graphs are the ones counted). compile="reduce-overhead": CUDA graphs without max-autotune's
kernel autotuning, so each compile fits a short GPU slot."""

import pytest
import torch

import fastdiff_helpers as fdh

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def sd15(**recipe):
    torch._dynamo.reset()
    base = dict(dtype="bf16", attention="sdpa", compile_vae=False)
    return fdh.apply(fdh.load_pipeline("sd15", weights="random", device="cuda"),
                     fdh.Recipe(**dict(base, **recipe)))


def test_reduce_overhead_captures_then_replays():
    pipe = sd15(compile="reduce-overhead")
    result = fdh.benchmark(pipe, steps=2, runs=3, warmup=2, max_runs=3, progress=False)
    graphs = result.compile_events["cudagraphs"]
    print("\n", graphs)
    assert graphs["skips"] == 0 and graphs["skip_reasons"] == []
    assert graphs["captures"] >= 1 and graphs["rerecords"] == 0
    # 3 timed calls of 2 UNet calls each replay at least (warm-up and capture come before)
    assert graphs["replays"] >= 3 * 2
    assert graphs["summary"].startswith(f"{graphs['captures']} captured")


def test_a_new_parameter_re_records_without_recompiling():
    """A parameter replaced by a new tensor of the same shape, dtype and requires_grad is a new
    static input address (cudagraph_trees.py:1845-1861, check_invariants ->
    StaticInputIdxMismatch), so the graph re-records (cudagraph_trees.py:2299-2306: not counted
    toward the unexpected re-record limit); dynamo does not recompile (parameters are graph
    inputs). The copy keeps requires_grad: the pipelines' parameters have requires_grad=True,
    and a copy with requires_grad=False fails dynamo's guard and recompiles instead
    (tests/test_cudagraphs.py pins that on the CPU). Not a LoRA: loading one adds modules and
    recompiles (notebook 14)."""
    from fastdiff_helpers.measure.compile_events import snapshot

    pipe = sd15(compile="reduce-overhead")
    for _ in range(3):  # warm up, capture, replay
        fdh.generate(pipe, steps=2)
    frames = snapshot().frames
    conv = pipe.unet.conv_in
    conv.weight = torch.nn.Parameter(conv.weight.detach().clone(),
                                     requires_grad=conv.weight.requires_grad)
    report = fdh.cudagraph_report(pipe, call=lambda: fdh.generate(pipe, steps=2))
    print("\n", report)
    assert snapshot().frames == frames  # no recompile
    assert report["rerecords"] >= 1 and report["unexpected_rerecords"] == 0


def test_a_new_shape_captures_a_new_graph():
    pipe = sd15(compile="reduce-overhead")
    for _ in range(3):
        fdh.generate(pipe, steps=2)
    report = fdh.cudagraph_report(
        pipe, call=lambda: fdh.generate(pipe, steps=2, height=384, width=384))
    assert report["captures"] + report["rerecords"] >= 1


def test_regional_compile_captures_none_and_says_why():
    pipe = sd15(compile="reduce-overhead", compile_scope="regional")
    fdh.generate(pipe, steps=2)
    fdh.generate(pipe, steps=2)
    report = fdh.cudagraph_report(pipe)
    assert report["captures"] == 0
    assert "captures no CUDA graphs" in report["summary"] and "152887" in report["summary"]


def test_default_mode_captures_none():
    pipe = sd15(compile="default")
    fdh.generate(pipe, steps=2)
    assert fdh.cudagraph_report(pipe)["summary"] == (
        "none captured: compile='default' captures no CUDA graphs")


def test_profile_on_a_gpu_adds_up():
    """fdh.profile's GPU path: kernel time by kind plus device idle time is the profiled
    wall time; stages agree with fdh.benchmark; the compiled UNet shows inductor's kernels."""
    pipe = sd15(compile="reduce-overhead")
    p = fdh.profile(pipe, steps=4, runs=3, warmup=2)  # warm-up, then capture: timed calls replay
    print("\n" + p.table())
    assert abs(sum(p.kinds.values()) - p.profiled_wall_s) <= 0.10 * p.profiled_wall_s
    assert p.kinds["matmul"] + p.kinds["convolution"] + p.kinds["attention"] > 0
    result = fdh.benchmark(pipe, steps=4, runs=3, warmup=1, progress=False)
    groups = p.stage_groups()
    for stage in ("text_encoding", "denoising", "vae_decode"):
        assert abs(groups[stage] - result.stages[stage]) <= 0.10 * result.stages[stage], stage
