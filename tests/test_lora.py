"""LoRA hot-swap on a compiled pipeline (issue 28), on the tiny SDXL UNet on the CPU.

LoRA files are made with peft and saved by diffusers' own save_lora_weights, then loaded back
through load_lora_weights, as a user's file would be."""

import statistics

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.techniques.lora import resolve_lora
from conftest import eager_compiled_block
from fastdiff_helpers.errors import FastdiffError

COMPILED_TOL = 1e-4   # inductor may reorder reductions: tests/test_techniques.py's bound
ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")


def fresh():
    return fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False)


def image(pipe):
    kwargs = fdh.call_kwargs(pipe, steps=2)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0]


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    root, pipe = tmp_path_factory.mktemp("loras"), fresh()
    # A at rank 4 and B at rank 8, the ranks of notebook 14's two LoRAs in smoke mode (8 and
    # 4): the UNet compiled with each (no hot-swap) is the same graph there and here, so make
    # test's shared compile cache compiles each once (a rank-2 B cost it one more compile)
    return {
        "A": fdh.course.make_lora_file(pipe, root / "A", rank=4, seed=1),
        "B": fdh.course.make_lora_file(pipe, root / "B", rank=8, seed=2),
        "subset": fdh.course.make_lora_file(pipe, root / "subset", rank=2, targets=("to_q",), seed=3),
        "other": fdh.course.make_lora_file(pipe, root / "other", rank=2, targets=("proj_in",), seed=4),
        "big": fdh.course.make_lora_file(pipe, root / "big", rank=16, seed=5),
        "text": fdh.course.make_lora_file(pipe, root / "text", rank=2, seed=6, text_encoder=True),
        "mixed": fdh.course.make_lora_file(pipe, root / "mixed", rank=4, seed=7,
                                    rank_pattern={"to_q": 2}),
    }


@pytest.fixture(scope="module")
def references(loras):
    """The uncompiled pipeline's image with no LoRA and with each LoRA, loaded plainly."""
    out = {"none": image(fresh())}
    for name in ("A", "B"):
        pipe = fresh()
        fdh.load_lora(pipe, loras[name])
        out[name] = image(pipe)
    return out


def test_lora_file_is_what_was_asked(loras):
    info = fdh.lora_file_info(loras["A"])
    assert info["rank"] == 4 and not info["text_encoder"]
    # the tiny SDXL UNet has 16 attention blocks with 4 projections each (1 + 2 + 1 blocks of
    # 2 transformer layers x 2 attentions, down, mid and up: counted from the model)
    unet = fresh().unet
    expected = sorted(n for n, m in unet.named_modules() if isinstance(m, torch.nn.Linear)
                      and n.endswith(ATTENTION))
    assert info["layers"] == expected and len(expected) > 8
    assert fdh.lora_file_info(loras["subset"])["layers"] == [n for n in expected
                                                            if n.endswith("to_q")]
    assert fdh.lora_file_info(loras["text"])["text_encoder"]
    # mixed ranks: peft's rank_pattern, every to_q at rank 2, the rest at 4
    from safetensors import safe_open
    with safe_open(str(resolve_lora(loras["mixed"])), framework="pt") as f:
        ranks = {k: f.get_slice(k).get_shape()[0] for k in f.keys() if ".lora.down." in k}
    assert {r for k, r in ranks.items() if ".to_q." in k} == {2}
    assert {r for k, r in ranks.items() if ".to_q." not in k} == {4}


def test_a_lora_for_the_full_size_unet_costs_no_model_memory(tmp_path):
    """make_lora_file builds peft's layers on a meta-device copy: it works on a pipeline built
    on the meta device (full-size SDXL, nothing allocated), one LoRA layer per projection."""
    pipe = fdh.load_pipeline("sdxl", weights="random", device="meta", verbose=False)
    info = fdh.lora_file_info(fdh.course.make_lora_file(pipe, tmp_path / "full", rank=4))
    projections = [n for n, m in pipe.unet.named_modules() if isinstance(m, torch.nn.Linear)
                   and n.endswith(ATTENTION)]
    assert info["rank"] == 4 and info["layers"] == sorted(projections)
    assert len(projections) == 4 * 2 * 70   # SDXL: 70 transformer blocks, 2 attentions each


def test_each_lora_changes_the_image_and_unloading_restores_it(loras, references):
    assert np.abs(references["A"] - references["none"]).max() > 0.05
    assert np.abs(references["A"] - references["B"]).max() > 0.05
    pipe = fresh()
    fdh.load_lora(pipe, loras["A"])
    pipe.unload_lora_weights()  # diffusers' own call: fdh reads what it left off the pipeline
    assert np.abs(image(pipe) - references["none"]).max() == 0
    # nothing is left to swap out, though fdh.load_lora loaded A and was not told of the unload
    with pytest.raises(FastdiffError, match="No LoRA loaded"):  # the course's report
        fdh.course.lora_swap_report(pipe, [loras["B"]])
    with pytest.raises(FastdiffError, match="needs a LoRA to swap out"):
        fdh.load_lora(pipe, loras["B"], hotswap=True)
    fdh.load_lora(pipe, loras["B"])  # the adapter name "default" is free again
    assert np.abs(image(pipe) - references["B"]).max() == 0


def test_fuse_gives_the_unfused_image_and_unfuse_restores(loras, references):
    """diffusers' pipe.fuse_lora() and pipe.unfuse_lora(), as lesson 14 calls them: fdh.load_lora
    reads peft's merged flags, so it refuses a swap into fused weights before peft would."""
    pipe = fresh()
    fdh.load_lora(pipe, loras["A"])
    pipe.fuse_lora()
    assert np.abs(image(pipe) - references["A"]).max() < 2e-5  # W + BA vs W x + B(A x)
    with pytest.raises(FastdiffError, match=r"pipe\.unfuse_lora\(\) first"):
        fdh.load_lora(pipe, loras["B"], hotswap=True)
    pipe.unfuse_lora()
    assert np.abs(image(pipe) - references["A"]).max() < 2e-5


def test_uncompiled_hotswap_gives_each_loras_image(loras, references):
    pipe = fresh()
    fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras["A"])
    lora_a = pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q.lora_A
    assert lora_a["default"].weight.shape[0] == 8  # padded to the target rank
    for name in ("B", "A"):
        fdh.load_lora(pipe, loras[name], hotswap=True)
        assert np.abs(image(pipe) - references[name]).max() < 2e-5


def test_swap_report_times_each_lora_until_steady_and_says_how_sure(loras, references):
    """lora_swap_report times the first call after each switch alone, then enough calls for
    a steady median (timing.until_steady, as fdh.benchmark), quoted with its +- (it timed one
    call each before). Uncompiled hot-swaps: nothing compiles, each image is its LoRA's."""
    from fastdiff_helpers.measure.timing import uncertainty

    pipe = fresh()
    fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras["A"])
    report = fdh.course.lora_swap_report(pipe, [loras["B"], loras["A"]], runs=3, max_runs=5)
    for row, name in zip(report["rows"], ("A", "B", "A")):
        assert 3 <= len(row["samples"]) <= 5 and row["first_call_s"] > 0
        assert row["seconds"] == statistics.median(row["samples"])
        assert row["uncertainty"] == uncertainty(row["samples"]) is not None
        assert row["timing"].startswith(f"{row['seconds']:.3f} s +-{row['uncertainty']:.0%} ")
        assert row["later_frames_compiled"] == row["frames_compiled"] == 0
        assert np.abs(row["image"] - references[name]).max() < 2e-5, name
    assert not report["recompiled"]
    with pytest.raises(FastdiffError, match="max_runs"):
        fdh.course.lora_swap_report(pipe, [loras["B"]], runs=3, max_runs=2)


@pytest.mark.parametrize("name, match", [
    ("other", "layer"), ("big", "rank 16, above the target rank 8"),
    ("text", "text-encoder"), ("mixed", r"config differs .*alpha_pattern: \{\} loaded, 16 per-layer value")])
def test_what_breaks_a_hotswap_is_refused_before_loading(loras, name, match):
    pipe = fresh()
    fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras["A"])
    before = {k: v.clone() for k, v in pipe.unet.state_dict().items() if "lora_" in k}
    with pytest.raises(FastdiffError, match=match):
        fdh.load_lora(pipe, loras[name], hotswap=True)
    after = {k: v for k, v in pipe.unet.state_dict().items() if "lora_" in k}
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    fdh.load_lora(pipe, loras["subset"], hotswap=True)  # a subset of the layers is fine


def _plain_with_a(loras):
    pipe = fresh()
    pipe.enable_lora_hotswap(target_rank=8)
    pipe.load_lora_weights(str(loras["A"]), adapter_name="default")
    return pipe


def test_the_refusals_match_what_the_libraries_do(loras):
    """Without the helper's check, peft and diffusers fail (other layers, a text encoder, a
    config with other per-layer alphas) or change the tensors' shapes (a rank above the
    target), which a compiled graph cannot keep. A failed hot-swap of other layers or of
    another config also deletes the loaded adapter (diffusers/loaders/peft.py:356-366,
    load_lora_adapter's except branch): why the helper checks before loading."""
    pipe = _plain_with_a(loras)
    with pytest.raises(RuntimeError, match="unexpected keys"):
        pipe.load_lora_weights(str(loras["other"]), adapter_name="default", hotswap=True)
    assert "default" not in pipe.unet.peft_config
    with pytest.raises(ValueError, match="text encoders"):
        _plain_with_a(loras).load_lora_weights(str(loras["text"]), adapter_name="default",
                                               hotswap=True)
    pipe = _plain_with_a(loras)  # mixed ranks: another alpha_pattern (peft/utils/hotswap.py:622)
    with pytest.raises(ValueError, match="Configs are incompatible: for alpha_pattern"):
        pipe.load_lora_weights(str(loras["mixed"]), adapter_name="default", hotswap=True)
    assert "default" not in pipe.unet.peft_config
    assert not [k for k in pipe.unet.state_dict() if "lora_" in k]  # no LoRA left at all
    pipe = _plain_with_a(loras)
    to_q = pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q
    pipe.load_lora_weights(str(loras["big"]), adapter_name="default", hotswap=True)
    assert to_q.lora_A["default"].weight.shape[0] == 16  # no longer the compiled shape


def test_order_is_enforced(loras, tmp_path):
    pipe = fresh()
    with pytest.raises(FastdiffError, match="needs a LoRA to swap out"):
        fdh.load_lora(pipe, loras["A"], hotswap=True)
    fdh.load_lora(pipe, loras["A"])
    with pytest.raises(FastdiffError, match="before the first LoRA"):
        fdh.enable_lora_hotswap(pipe, target_rank=8)
    with pytest.raises(FastdiffError, match="no LoRA file"):
        fdh.lora_file_info(tmp_path)
    (tmp_path / "lora.bin").write_bytes(b"not safetensors")
    with pytest.raises(FastdiffError, match="safetensors only"):
        fdh.lora_file_info(tmp_path / "lora.bin")
    with pytest.raises(FastdiffError, match="hf download nobody/no-such-lora x.safetensors"):
        fdh.lora_file_info(("nobody/no-such-lora", "x.safetensors"))  # offline in the tests
    file = resolve_lora(loras["B"])
    assert fdh.lora_file_info(file) == fdh.lora_file_info((str(loras["B"]), file.name))
    with pytest.raises(FastdiffError, match="no LoRA loader"):
        fdh.course.make_lora_file(fdh.load_pipeline("pixart", weights="tiny", verbose=False),
                           tmp_path / "x")


def _compiled_with(loras, hotswap):
    pipe = fresh()
    if hotswap:
        fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras["A"])
    return fdh.compile_pipeline(pipe, mode="default", fullgraph=True, compile_vae=False)


@pytest.mark.slow
def test_hotswap_on_a_compiled_unet_never_recompiles(loras, references):
    pipe = _compiled_with(loras, hotswap=True)
    image(pipe)  # the compile
    with torch._dynamo.config.patch(error_on_recompile=True):
        report = fdh.course.lora_swap_report(pipe, [loras["B"], loras["A"]], hotswap=True)
    assert not report["recompiled"]
    assert [r["frames_compiled"] for r in report["rows"]] == [0, 0, 0]
    for row, name in zip(report["rows"], ("A", "B", "A")):
        assert np.abs(row["image"] - references[name]).max() <= COMPILED_TOL, name


@pytest.mark.slow
def test_without_hotswap_the_same_switch_recompiles(loras, references):
    pipe = _compiled_with(loras, hotswap=False)
    report = fdh.course.lora_swap_report(pipe, [loras["B"], loras["A"]], hotswap=False)
    assert report["rows"][0]["frames_compiled"] >= 1          # the cold start
    assert report["recompiled"] and report["rows"][1]["frames_compiled"] >= 1
    assert report["rows"][1]["reasons"]                      # dynamo says why
    for row, name in zip(report["rows"], ("A", "B", "A")):
        assert np.abs(row["image"] - references[name]).max() <= COMPILED_TOL, name


def test_08_exercises_on_one_compiled_transformer_block(loras):
    """08's exercises 1 and 3, tried on one transformer block of the tiny SDXL UNet compiled
    by dynamo alone (backend="eager": the guards are dynamo's whatever the backend). 1: a LoRA
    on a subset of the layers hot-swaps in without a recompile and zeroes the other layers'
    LoRA tensors (peft/utils/hotswap.py:504). 3: fusing recompiles, on peft's merged_adapters
    (tuners_utils.py, `merged`), which its LoRA layer checks in forward."""
    from fastdiff_helpers.measure.compile_events import recompile_reasons, snapshot

    torch._dynamo.reset()
    pipe = fresh()
    fdh.enable_lora_hotswap(pipe, target_rank=8)
    fdh.load_lora(pipe, loras["A"])
    block = pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0]
    call = eager_compiled_block(block)

    def frames_after_a_call():
        before = snapshot().frames
        call()
        return snapshot().frames - before

    assert frames_after_a_call() == 1  # the compile
    fdh.load_lora(pipe, loras["subset"], hotswap=True)
    assert frames_after_a_call() == 0
    attn = block.attn1
    for name in ("to_k", "to_v"):
        layer = getattr(attn, name)
        assert not layer.lora_A["default"].weight.any() and not layer.lora_B["default"].weight.any()
    assert not attn.to_out[0].lora_B["default"].weight.any()
    assert attn.to_q.lora_A["default"].weight.any()
    seen = {k: len(v) for k, v in recompile_reasons().items()}
    pipe.fuse_lora()
    assert frames_after_a_call() == 1
    new = [r for k, v in recompile_reasons().items() for r in v[seen.get(k, 0):]]
    assert any("merged_adapters" in r for r in new), new
