"""Every rule of Recipe and every ordering rule of apply() (issue 13): each refused
combination is built and its message says what to do; each order apply() keeps is observed."""

import re
import warnings

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.models.loading import get_denoiser
from fastdiff_helpers.techniques import recipe as recipe_module
from fastdiff_helpers.techniques.recipe import RecipeError


def fresh(model="sd15"):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


def test_recipe_dtypes_load_as_the_models_load_them():
    """A Recipe's dtype names the weights load_pipeline loads (fdh.load_pipeline(dtype=...)),
    "tf32" being fp32 weights with TF32 math: one vocabulary (models/dtypes.py) for both."""
    from fastdiff_helpers.models.dtypes import weight_dtype
    from fastdiff_helpers.models.dtypes import DTYPES

    weights = {name: weight_dtype(name) for name in recipe_module.DTYPES}
    assert {name: dtype for name, dtype in weights.items() if name != "tf32"} == DTYPES
    assert weights["tf32"] is DTYPES["fp32"] is torch.float32


# -- Recipe.__post_init__ -----------------------------------------------------------------

@pytest.mark.parametrize("field, value, allowed", [
    ("dtype", "fp8", recipe_module.DTYPES),
    ("attention", "xformers", recipe_module.ATTENTION),
    ("compile", "fast", recipe_module.COMPILE_MODES),
    ("compile_scope", "blocks", recipe_module.SCOPES),
    ("quantize", "int4", recipe_module.QUANTIZE),
    ("quant_filter", "big", recipe_module.QUANT_FILTERS),
    ("tf32", "fast", (None,) + recipe_module.TF32_MODES),
    ("conv1x1_to_linear", "some", recipe_module.CONV_SWAPS),
])
def test_unknown_values_are_refused_with_the_allowed_ones(field, value, allowed):
    shown = ", ".join(repr(a) for a in allowed)
    assert len(allowed) >= 2
    with pytest.raises(RecipeError, match=re.escape(f"Unknown {field} {value!r}. Use one of: "
                                                    f"{shown}.")):
        fdh.Recipe(**{field: value})
    needs = {"compile_scope": dict(compile="default"), "quantize": dict(dtype="bf16"),
             "attention": dict(dtype="bf16")}  # flash and cuDNN take fp16/bf16 only
    for ok in allowed:  # and every allowed value is accepted
        assert getattr(fdh.Recipe(**needs.get(field, {}), **{field: ok}), field) == ok


def test_tf32_off_with_dtype_tf32_is_refused():
    with pytest.raises(RecipeError, match="contradicts itself: use dtype='fp32' for true fp32"):
        fdh.Recipe(dtype="tf32", tf32="off")


def test_a_callable_quant_filter_is_accepted():
    def only_attention(module, fqn):
        return "attn" in fqn

    assert fdh.Recipe(dtype="bf16", quantize="int8-dynamic",
                      quant_filter=only_attention).quant_filter is only_attention


@pytest.mark.parametrize("value", ["yes", 1.5, "True"])
def test_dynamic_must_be_none_true_or_false(value):
    with pytest.raises(RecipeError, match="dynamic must be None, True or False"):
        fdh.Recipe(compile="default", dynamic=value)
    for ok in (None, True, False):
        assert fdh.Recipe(compile="default", dynamic=ok).dynamic is ok


@pytest.mark.parametrize("field", ["fullgraph", "inductor_flags"])
def test_compile_options_without_compile_are_refused(field):
    with pytest.raises(RecipeError, match=f"{field}=True needs compile: set compile="):
        fdh.Recipe(**{field: True})
    assert getattr(fdh.Recipe(compile="default", **{field: True}), field) is True


@pytest.mark.parametrize("kwargs", [dict(compile_scope="regional"), dict(dynamic=True),
                                    dict(dynamic=False)])
def test_compile_scope_and_dynamic_without_compile_are_refused(kwargs):
    with pytest.raises(RecipeError, match="compile_scope and dynamic need compile: set compile"):
        fdh.Recipe(**kwargs)
    fdh.Recipe(compile="default", **kwargs)  # fine with compile


def test_fuse_qkv_needs_sdpa():
    with pytest.raises(RecipeError, match="fuse_qkv needs an SDPA attention.*attention='sdpa'"):
        fdh.Recipe(fuse_qkv=True, attention="classic")
    for attention in ("sdpa", "sdpa-math", "sdpa-flash"):
        fdh.Recipe(fuse_qkv=True, attention=attention, dtype="bf16")


@pytest.mark.parametrize("dtype", ["fp32", "tf32"])
@pytest.mark.parametrize("kind", ["int8-dynamic", "fp8-dynamic"])
def test_activation_quantization_needs_bf16(dtype, kind):
    with pytest.raises(RecipeError, match=f"quantize='{kind}' is meant for bf16.*dtype='bf16'"):
        fdh.Recipe(dtype=dtype, quantize=kind)
    fdh.Recipe(dtype="bf16", quantize=kind)
    fdh.Recipe(dtype="fp16", quantize=kind)
    fdh.Recipe(dtype=dtype, quantize="int8-weight-only")  # weight-only is allowed in fp32


# -- Recipe.check_device ------------------------------------------------------------------

@pytest.mark.parametrize("attention", ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn"])
@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_cuda_kernels_are_refused_off_cuda(attention, device):
    with pytest.raises(RecipeError, match=f"'{attention}' is a CUDA kernel; on {device} use "
                                          "'sdpa' or 'sdpa-math'"):
        fdh.Recipe(attention=attention, dtype="bf16").check_device(device)
    fdh.Recipe(attention=attention, dtype="bf16").check_device("cuda:0", capability=(8, 0))
    for fine in ("sdpa", "sdpa-math", "classic"):
        fdh.Recipe(attention=fine).check_device(device)


@pytest.mark.parametrize("mode, runs", [("max-autotune", "max-autotune-no-cudagraphs"),
                                        ("reduce-overhead", "default")])
def test_cuda_graph_modes_run_without_the_graphs_off_cuda(mode, runs):
    """The one policy (fdh.Recipe): off CUDA a CUDA-graph mode is not refused but runs as the
    same inductor options without the graphs, which is what torch itself does there (its option
    sets differ by triton.cudagraphs alone), said in a note."""
    import torch._inductor as inductor

    recipe = fdh.Recipe(compile=mode)
    recipe.check_device("cpu")  # nothing here names hardware the CPU lacks
    adapted, notes = recipe.for_device("cpu")
    assert adapted.compile == runs and adapted.changes(recipe) == ["compile"]
    assert len(notes) == 1 and "CUDA graphs" in notes[0] and "see fdh.Recipe" in notes[0]
    asked, ran = inductor.list_mode_options(mode), inductor.list_mode_options(runs)
    assert {k: v for k, v in asked.items() if k != "triton.cudagraphs"} == ran
    assert asked["triton.cudagraphs"] is True and "triton.cudagraphs" not in ran
    assert recipe.for_device("cuda:0") == (recipe, [])  # a full compile keeps them on CUDA
    for fine in ("default", "max-autotune-no-cudagraphs", None):
        assert fdh.Recipe(compile=fine).for_device("cpu") == (fdh.Recipe(compile=fine), [])


@pytest.mark.parametrize("device, capability, have", [
    ("cpu", None, "this has cpu"),
    ("cuda:0", (8, 0), r"this has compute capability \(8, 0\)"),
    ("cuda", (8, 6), r"this has compute capability \(8, 6\)"),
])
def test_fp8_needs_compute_capability_8_9(device, capability, have):
    recipe = fdh.Recipe(dtype="bf16", quantize="fp8-dynamic")
    with pytest.raises(RecipeError, match=f"fp8-dynamic needs a GPU with fp8 tensor cores.*"
                                          f"{have}.*quantize='int8-dynamic'"):
        recipe.check_device(device, capability)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_fp8_is_accepted_from_compute_capability_8_9(capability):
    fdh.Recipe(dtype="bf16", quantize="fp8-dynamic").check_device("cuda:0", capability)


def test_check_device_runs_before_any_work_in_apply():
    pipe = fresh()
    with pytest.raises(RecipeError, match="CUDA kernel"):
        fdh.apply(pipe, fdh.Recipe(dtype="bf16", attention="sdpa-flash", fuse_qkv=True))
    assert pipe.unet.dtype == torch.float32 and not fdh.pipeline_info(pipe).applied


# -- apply(): what it takes and when ------------------------------------------------------

def test_apply_takes_a_recipe_only():
    with pytest.raises(RecipeError, match="apply\\(\\) takes a fdh.Recipe, not dict"):
        fdh.apply(fresh(), {"dtype": "bf16"})


def test_apply_after_techniques_one_by_one_is_refused():
    pipe = fdh.set_attention(fresh(), "sdpa")
    with pytest.raises(RecipeError, match=r"already applied one by one \(attention\); load a "
                                          "fresh pipeline"):
        fdh.apply(pipe, fdh.Recipe(attention="sdpa"))


def test_quantizing_without_compile_warns():
    # it says what is known (on a GPU, measured by others) and asks for a measurement here: a
    # tiny model on a CPU measured int8 eager faster than bf16 (issue 24), so "slower" is not
    # a claim to make about every machine
    with pytest.warns(UserWarning, match="without torch.compile: on a GPU.*550 s eager.*compile="
                                         "'max-autotune'.*measure both on your machine"):
        fdh.apply(fresh(), fdh.Recipe(dtype="bf16", quantize="int8-dynamic",
                                      quant_filter="all"))


# -- the order of the techniques ----------------------------------------------------------

def quantized_pipe():
    pipe = fdh.set_precision(fresh(), "bf16")
    fdh.quantize(pipe, "int8-dynamic", "all")
    return pipe


def compiled_pipe():
    # compile is lazy: nothing is compiled before the first call, so this is cheap
    return fdh.compile_pipeline(fresh(), mode="default")


@pytest.mark.parametrize("late, call", [
    ("set_precision", lambda p: fdh.set_precision(p, "bf16")),
    ("conv1x1_to_linear", fdh.conv1x1_to_linear),
    ("fuse_qkv", fdh.fuse_qkv),
])
@pytest.mark.parametrize("earlier, make", [("quantize", quantized_pipe),
                                           ("compile", compiled_pipe)])
def test_techniques_that_must_come_first_are_refused_after(late, call, earlier, make):
    pipe = make()
    with pytest.raises(RecipeError, match=f"{late} must come before {earlier}, which this "
                                          f"pipeline already has. Load a fresh pipeline"):
        call(pipe)


def test_attention_and_quantization_are_refused_after_compile():
    with pytest.raises(RecipeError, match="set_attention must come before compile"):
        fdh.set_attention(compiled_pipe(), "sdpa")
    pipe = fdh.compile_pipeline(fdh.set_precision(fresh(), "bf16"), mode="default")
    with pytest.raises(RecipeError, match="quantize must come before compile"):
        fdh.quantize(pipe, "int8-dynamic", "all")
    with pytest.raises(RecipeError, match="already compiled; load a fresh pipeline"):
        fdh.compile_pipeline(pipe, mode="default")


def test_quantizing_twice_and_classic_attention_on_fused_projections_are_refused():
    with pytest.raises(RecipeError, match="already quantized; load a fresh pipeline"):
        fdh.quantize(quantized_pipe(), "int8-dynamic", "all")
    pipe = fdh.fuse_qkv(fdh.set_attention(fresh(), "sdpa"))
    with pytest.raises(RecipeError, match="fused QKV projections.*use 'sdpa'"):
        fdh.set_attention(pipe, "classic")
    with pytest.raises(RecipeError, match="fuse_qkv needs an SDPA attention.*'sdpa'\\) first"):
        fdh.fuse_qkv(fdh.set_attention(fresh(), "classic"))


def quantized_linears(pipe) -> dict[str, torch.nn.Linear]:
    """The linears of the denoiser and VAE whose weight is a torchao tensor subclass."""
    return {f"{o}.{n}": m for o, owner in (("denoiser", get_denoiser(pipe)), ("vae", pipe.vae))
            for n, m in owner.named_modules()
            if isinstance(m, torch.nn.Linear)
            and type(m.weight) not in (torch.Tensor, torch.nn.Parameter)}


def test_apply_swaps_1x1_convs_before_quantizing_so_they_are_quantized_too():
    base = dict(dtype="bf16", attention="sdpa", quantize="int8-dynamic", quant_filter="all")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = fdh.apply(fresh(), fdh.Recipe(**base))
        swapped = fdh.apply(fresh(), fdh.Recipe(**base, conv1x1_to_linear="all"))
    channels = {f"{o}.{n}": (m.in_channels, m.out_channels)
                for o, owner in (("denoiser", plain.unet), ("vae", plain.vae))
                for n, m in owner.named_modules()
                if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)}
    convs = set(channels)
    left = {f"{o}.{n}" for o, owner in (("denoiser", swapped.unet), ("vae", swapped.vae))
            for n, m in owner.named_modules()
            if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)}
    gone = convs - left
    assert gone  # the swap replaced some 1x1 convs...
    # int8 dynamic takes the linears whose sizes its int8 matmul kernels take (multiples of 8)
    takes = {p for p in gone if all(c % 8 == 0 for c in channels[p])}
    assert takes
    before, after = quantized_linears(plain), quantized_linears(swapped)
    assert len(after) - len(before) == len(takes), (len(before), len(after), len(takes))
    for path in takes:  # ...and the linears that replaced them are quantized
        assert any(name == path or name.startswith(path + ".") for name in after), path
    assert fdh.pipeline_info(swapped).applied["quantize"]["linears"] == len(after)


def test_apply_fuses_before_quantizing_so_the_fused_projections_are_quantized():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = fdh.apply(fresh(), fdh.Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True,
                                             quantize="int8-dynamic", quant_filter="all"))
    fused = {n for n in quantized_linears(pipe) if n.endswith((".to_qkv", ".to_kv"))}
    attention = [m for m in pipe.unet.modules() if hasattr(m, "to_qkv")]
    assert attention and len(fused) >= len(attention)


def test_apply_casts_before_quantizing_so_quantized_weights_compute_in_bf16():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = fdh.apply(fresh(), fdh.Recipe(dtype="bf16", attention="sdpa",
                                             quantize="int8-dynamic", quant_filter="all"))
    weights = quantized_linears(pipe)
    assert weights and {m.weight.dtype for m in weights.values()} == {torch.bfloat16}
