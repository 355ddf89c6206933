"""fp8 on Hopper (issue 27, part 1): what decides it, pinned without a GPU. What only a GPU
shows (it runs, its quality bound, its speed against bf16 + compile) is in
tests/gpu/test_gpu_fp8.py.

The kernel rule restated here is torch's: torch._scaled_mm needs in_features and
out_features to be multiples of 16 (torch/_meta_registrations.py, _check_scaled_mm_sizes)."""

from __future__ import annotations

import collections

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs import ladder as ladder_module
from fastdiff_helpers.course.runs import warm as warm_module
from fastdiff_helpers.techniques import quantization
from fastdiff_helpers.techniques.recipe import FP8, RecipeError
from fastdiff_helpers.course.planning.ladders import COURSE_LADDER

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def scaled_mm_takes(m) -> bool:
    return m.in_features % 16 == 0 and m.out_features % 16 == 0


def meta(model, fused=True, swap=None):
    pipe = fdh.load_pipeline(model, weights="random", device="meta", verbose=False)
    if fused:
        fdh.fuse_qkv(fdh.set_attention(pipe, "sdpa"))
    if swap:
        fdh.conv1x1_to_linear(pipe, swap)
    return pipe


def linears(module):
    return [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]


# What the fp8 filter selects on the full-size models (fused QKV, every pointwise conv swapped:
# the widest set of linears a recipe can hand it), per part and filter. Measured on the meta
# device; every linear of the four denoisers is one torch's fp8 matmul takes. "fastdiff"
# leaves out each ResNet block's time_emb_proj since issue 61 (one row per image; 7, 12 and 6
# fewer than before).
SELECTED = {  # model: (denoiser linears, "fastdiff" selects of them, "blog" selects)
    "sdxl": (544, 406, 397), "sd15": (182, 70, 128), "ssd1b": (289, 194, 188),
    "pixart": (206, 168, 206)}


@pytest.mark.parametrize("model", list(SELECTED))
def test_fp8_filter_selects_only_linears_the_fp8_kernels_take(model):
    pipe = meta(model, swap="all")
    denoiser, vae = fdh.get_denoiser(pipe), pipe.vae
    total, fastdiff, blog = SELECTED[model]
    for kind in FP8:
        counts = {}
        for name in ("all", "fastdiff", "blog"):
            chosen = quantization.select_filter(kind, name)
            picked = [m for part in (denoiser, vae) for n, m in linears(part) if chosen(m, n)]
            assert all(scaled_mm_takes(m) for m in picked), (kind, name)
            counts[name] = sum(1 for n, m in linears(denoiser) if chosen(m, n))
        assert counts == {"all": total, "fastdiff": fastdiff, "blog": blog}
    assert len(linears(denoiser)) == total  # no denoiser linear is refused by the kernels
    # the VAE's swapped quant_conv (8->8) and post_quant_conv (4->4) are: left in bf16
    refused = collections.Counter((m.in_features, m.out_features) for _, m in linears(vae)
                                  if not scaled_mm_takes(m))
    assert refused == {(8, 8): 1, (4, 4): 1}
    fp8 = quantization.select_filter("fp8-dynamic", "all")
    assert sum(1 for n, m in linears(vae) if fp8(m, n)) == len(linears(vae)) - 2 == 8


@pytest.mark.parametrize("model", list(SELECTED))
def test_our_rule_is_torchaos_own_check(model):
    """torchao's fp8 config skips (silently) what its _fp8_mm_compat refuses: the same rule."""
    from torchao.quantization.utils import _fp8_mm_compat

    pipe = meta(model, swap="all")
    for part in (fdh.get_denoiser(pipe), pipe.vae):
        for _, m in linears(part):
            assert quantization.fp8_kernel_ok(m) == _fp8_mm_compat(m.weight)
    assert not quantization.fp8_kernel_ok(torch.nn.Linear(4, 4))
    assert not quantization.fp8_kernel_ok(torch.nn.Linear(320, 8))
    assert quantization.fp8_kernel_ok(torch.nn.Linear(2048, 1280))


@pytest.mark.parametrize("model, unfused, fused", [("sdxl", 743, 533), ("sd15", 184, 136),
                                                   ("ssd1b", 380, 278), ("pixart", 290, 206)])
def test_fused_qkv_and_the_conv_swap_with_fp8(model, unfused, fused):
    """Fused QKV makes three projections one wider linear (still multiples of 16: fp8 takes
    it); the 1x1-conv swap hands fp8 the pointwise convs of the denoiser, which the kernels
    take, and the VAE's 4- and 8-channel ones, which they do not."""
    fp8 = quantization.select_filter("fp8-dynamic-row", "all")
    plain, merged = meta(model, fused=False), meta(model)
    assert sum(fp8(m, n) for n, m in linears(fdh.get_denoiser(plain))) == unfused
    assert sum(fp8(m, n) for n, m in linears(fdh.get_denoiser(merged))) == fused
    qkv = [m for n, m in linears(fdh.get_denoiser(merged)) if n.endswith("to_qkv")]
    assert qkv and all(fp8(m, "") and m.out_features % 3 == 0 for m in qkv)
    swapped = meta(model, swap="all")
    gained = (sum(fp8(m, n) for n, m in linears(fdh.get_denoiser(swapped))) - fused)
    assert gained == {"sdxl": 11, "sd15": 46, "ssd1b": 11, "pixart": 0}[model]
    assert sum(fp8(m, n) for n, m in linears(swapped.vae)) == 4 + 4  # 4 attention + 4 convs


# -- the choice of granularity, and the code it writes ---------------------------------------

def test_granularity_is_a_choice_said_to_torchao():
    from torchao.quantization import PerRow, PerTensor

    row = quantization.quant_config("fp8-dynamic-row")
    tensor = quantization.quant_config("fp8-dynamic")
    assert all(isinstance(g, PerRow) for g in row.granularity)
    assert all(isinstance(g, PerTensor) for g in tensor.granularity)
    assert row.set_inductor_config is False and tensor.set_inductor_config is False


def test_to_code_writes_the_granularity_and_the_kernel_rule():
    recipe = dict(COURSE_LADDER)["+ fp8 dynamic"]
    code = fdh.to_code(recipe, "plain")
    assert "Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), " in code
    assert "def fp8_kernel_ok" in code and "filter_fn=fp8_filter" in code
    assert "force_fuse_int_mm_with_mul" not in code  # the int8 flag: torch._int_mm only
    assert "force_fuse_int_mm_with_mul" in fdh.to_code(fdh.course.LADDER[-1][1], "plain")  # blog int8
    # the course's int8 step compiles without the blog's flags (fusion alone, issue 44)
    assert "force_fuse_int_mm_with_mul" not in fdh.to_code(
        dict(COURSE_LADDER)["+ int8 dynamic"], "plain")
    tensor = fdh.to_code(fdh.Recipe(dtype="bf16", quantize="fp8-dynamic"), "plain")
    assert "granularity=PerTensor()" in tensor


def test_course_ladder_ends_with_fp8_in_place_of_int8_then_autotuning():
    (name, fp8), (_, int8) = COURSE_LADDER[-2], COURSE_LADDER[-3]
    assert name == "+ fp8 dynamic" and fp8.changes(int8) == ["quantize"]
    assert fp8.quantize == "fp8-dynamic-row" and fp8.compile == "reduce-overhead"
    assert fp8 not in [r for _, r in fdh.course.LADDER]  # the course's own, never the blog's
    assert COURSE_LADDER[-1][0] == "+ autotune" and COURSE_LADDER[-1][1].quantize == fp8.quantize


# -- refused before any work where it cannot run ---------------------------------------------

@pytest.mark.parametrize("kind", FP8)
@pytest.mark.parametrize("device, capability", [("cpu", None), ("cuda:0", (8, 0)),
                                                ("cuda:0", (8, 6))])
def test_fp8_is_refused_below_8_9_in_one_line(kind, device, capability):
    recipe = fdh.Recipe(dtype="bf16", quantize=kind)
    with pytest.raises(RecipeError) as caught:
        recipe.check_device(device, capability)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{kind} needs a GPU with fp8 tensor cores")
    assert "quantize='int8-dynamic'" in str(caught.value)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0)])
def test_fp8_row_is_accepted_from_8_9(capability):
    fdh.Recipe(dtype="bf16", quantize="fp8-dynamic-row").check_device("cuda:0", capability)


def test_fp8_row_needs_bf16_weights():
    with pytest.raises(RecipeError, match="'fp8-dynamic-row' needs bf16 weights"):
        fdh.Recipe(dtype="fp16", quantize="fp8-dynamic-row")
    fdh.Recipe(dtype="fp16", quantize="fp8-dynamic")  # per tensor takes fp16


def test_the_ladder_refuses_fp8_on_a_cpu_before_loading(monkeypatch):
    loaded = []
    monkeypatch.setattr(ladder_module, "load_pipeline",
                        lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    (result,) = ladder_module.run_ladder("sd15", weights="tiny", device="cpu", steps=2, runs=1,
                                         warmup=0, steps_filter=["+ fp8 dynamic"],
                                         progress=False, ladder="course")
    assert result.error.startswith("RecipeError: fp8-dynamic-row needs a GPU with fp8")
    assert loaded == []


def test_warm_ladder_skips_fp8_on_a_cpu(monkeypatch, capsys):
    monkeypatch.setattr(warm_module, "load_pipeline", lambda *a, **k: pytest.fail("loaded"))
    rows = warm_module.warm_ladder("sd15", weights="tiny", device="cpu", ladder="course",
                                     steps_filter=["+ fp8 dynamic"])
    assert rows == []
    assert "not warming sd15 + fp8 dynamic: fp8-dynamic-row needs a GPU" in capsys.readouterr().out


def test_the_bench_command_refuses_fp8_on_a_cpu_before_loading(monkeypatch, capsys):
    from fastdiff_helpers.course.runs import cli

    monkeypatch.setattr(cli, "load_pipeline", lambda *a, **k: pytest.fail("loaded"))
    code = cli.main(["bench", "--model", "sd15", "--weights", "tiny", "--device", "cpu",
                     "--dtype", "bf16", "--quantize", "fp8-dynamic-row"])
    assert code == 2
    assert "fp8-dynamic-row needs a GPU with fp8 tensor cores" in capsys.readouterr().err


def test_quantize_refuses_fp8_before_any_work_where_torchao_would_assert(tiny_pipes,
                                                                         monkeypatch):
    """fdh.quantize(pipe, "fp8-dynamic-row") on a CPU used to end in torchao's bare
    AssertionError (torchao/float8/inference.py, _check_hardware_support, at the first linear
    it converts): now the one policy's refusal (fdh.Recipe.check_device), a FastdiffError
    saying why and what to use, before quantize_ is called."""
    import torchao.quantization

    monkeypatch.setattr(torchao.quantization, "quantize_",
                        lambda *a, **k: pytest.fail("torchao's quantize_ ran"))
    pipe = tiny_pipes["sd15"]
    for kind in FP8:
        with pytest.raises(fdh.FastdiffError) as caught:
            fdh.quantize(pipe, kind)
        said = str(caught.value)
        assert said.startswith(f"{kind} needs a GPU with fp8 tensor cores (compute capability "
                               "8.9+") and "this has cpu" in said
        assert "quantize='int8-dynamic'" in said and "\n" not in said
        assert "quantize" not in fdh.pipeline_info(pipe).applied
    # on a device with fp8 (the capability check passed), per row on fp32 weights: torchao's
    # "PerRow quantization only works for bfloat16" assert, refused the same way
    monkeypatch.setattr(quantization.Recipe, "check_device", lambda self, device, cap=None: None)
    with pytest.raises(RecipeError, match="'fp8-dynamic-row' needs bf16 weights.*torch.float32"):
        fdh.quantize(pipe, "fp8-dynamic-row")
    assert issubclass(RecipeError, fdh.FastdiffError)
