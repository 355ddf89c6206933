"""GPU checks for issue 28 (LoRA hot-swap, fitting the GPU): `pytest tests/gpu -m gpu -k
"lora or memory or offload"`. What only a GPU shows: CUDA-graph recordings when LoRAs switch,
the offloads' peak and cost, and the CUDA allocator's view of the weights. Skipped without CUDA.
Full-size SD1.5 with random weights at 512x512 keeps each test short."""

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.techniques.memory_savers import OFFLOADS
from fastdiff_helpers.course.lora_swaps import count_cuda_graph_recordings
from fastdiff_helpers.course.recompiles import _swap_a_weight

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RECIPE = fdh.Recipe(dtype="bf16", attention="sdpa")
BF16_COMPILED_TOL = 0.1   # compiled bf16 against eager bf16 (tests/gpu/test_gpu.py's SDPA bound)


def sd15():
    return fdh.apply(fdh.load_pipeline("sd15", weights="random", device="cuda",
                                       verbose=False), RECIPE)


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    root, pipe = tmp_path_factory.mktemp("gpu-loras"), fdh.load_pipeline(
        "sd15", weights="random", device="meta", verbose=False)
    return [fdh.course.make_lora_file(pipe, root / "A", rank=8, seed=1),
            fdh.course.make_lora_file(pipe, root / "B", rank=4, seed=2)]


@pytest.fixture(scope="module")
def references(loras):
    out = []
    for lora in loras:
        pipe = sd15()
        fdh.load_lora(pipe, lora)
        kwargs = fdh.call_kwargs(pipe, steps=2)
        kwargs["output_type"] = "np"
        out.append(pipe(**kwargs).images[0])
        del pipe
        fdh.free_memory()
    return out


def _compiled(loras, hotswap):
    pipe = sd15()
    if hotswap:
        fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras[0])
    return fdh.compile_pipeline(pipe, mode="reduce-overhead", fullgraph=True, compile_vae=False)


def test_lora_hotswap_under_cuda_graphs_records_nothing_new(loras, references):
    pipe = _compiled(loras, hotswap=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        report = fdh.course.lora_swap_report(pipe, [loras[1], loras[0]], hotswap=True)
    assert report["rows"][0]["cuda_graphs_recorded"] >= 1      # the first call records
    assert not report["recompiled"] and not report["cuda_graphs_rerecorded"], report["rows"]
    for row, ref in zip(report["rows"], [references[0], references[1], references[0]]):
        assert np.abs(row["image"] - ref).max() < BF16_COMPILED_TOL


def test_lora_switch_without_hotswap_recompiles_and_records_again(loras):
    pipe = _compiled(loras, hotswap=False)
    report = fdh.course.lora_swap_report(pipe, [loras[1]], hotswap=False)
    assert report["recompiled"] and report["cuda_graphs_rerecorded"], report["rows"]


def test_a_hand_swapped_weight_rerecords_cuda_graphs_without_recompiling():
    """Notebook 12's claim (cell 7; 06's recompile report says the dynamo half): a new weight
    tensor of the same shape, dtype and requires_grad recompiles nothing in dynamo but makes
    CUDA graphs record again (torch/_inductor/cudagraph_trees.py,
    StaticInputIdxMismatch)."""
    pipe = fdh.compile_pipeline(sd15(), mode="reduce-overhead", fullgraph=True,
                                compile_vae=False)
    fdh.generate(pipe, steps=2)
    fdh.generate(pipe, steps=2)  # warmed and recorded
    _swap_a_weight(pipe)
    with torch._dynamo.config.patch(error_on_recompile=True):
        with count_cuda_graph_recordings() as recorded:
            fdh.generate(pipe, steps=2)
    assert recorded[0] >= 1


def test_weight_bytes_are_what_cuda_allocates_for_the_weights():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    pipe = fdh.load_pipeline("sd15", weights="random", device="cuda", dtype="bf16",
                             verbose=False)
    held = torch.cuda.memory_allocated() - before
    weights = sum(fdh.weight_bytes(pipe).values())
    assert weights == sum(fdh.weight_bytes("sd15", "bf16").values())
    buffers = sum(b.numel() * b.element_size() for m in pipe.components.values()
                  if isinstance(m, torch.nn.Module) for b in m.buffers())
    # the allocator rounds each tensor up to 512 bytes: a few hundred KB over ~1000 tensors
    assert weights + buffers <= held < weights + buffers + 2 * 2**20


def test_each_offload_lowers_the_peak_and_says_its_cost():
    rows = {r["saver"]: r for r in fdh.course.memory_savers_report(
        "sd15", savers=list(OFFLOADS), weights="random", dtype="bf16", steps=4)}
    none = rows["none"]
    for saver in OFFLOADS:
        assert rows[saver]["peak_bytes"] < none["peak_bytes"], (saver, rows[saver])
        assert rows[saver]["seconds"] > none["seconds"], saver  # copies cost time
    assert rows["sequential-offload"]["peak_bytes"] < rows["model-offload"]["peak_bytes"]


def test_vae_savers_and_freed_encoders_lower_the_full_size_peak():
    # 1024 px: above SD1.5's VAE tile (512), and two images for slicing
    rows = {r["saver"]: r for r in fdh.course.memory_savers_report(
        "sd15", savers=["vae-slicing", "vae-tiling", "text-encoders-freed"], weights="random",
        dtype="bf16", steps=2, size=1024, batch=2)}
    for saver in ("vae-slicing", "vae-tiling", "text-encoders-freed"):
        assert rows[saver]["peak_bytes"] < rows["none"]["peak_bytes"], (saver, rows[saver])


def test_which_savers_compose_with_compile():
    """The verdict the lesson reports: compiled after the saver, the measured calls compile
    nothing again and no saver fails under compile."""
    rows = fdh.course.memory_savers_report("sd15", weights="random", dtype="bf16", steps=2,
                                    size=1024, batch=2, compile=True)
    problems = [(r["saver"], r["recompiled_frames"], r["note"]) for r in rows
                if r["recompiled_frames"] != 0]
    assert not problems, problems
