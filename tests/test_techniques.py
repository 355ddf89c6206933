"""Pipeline surgery (issue 3): each technique on tiny models of all four families, on the CPU."""

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.models.loading import get_denoiser
from fastdiff_helpers.techniques import quantization
from fastdiff_helpers.techniques.recipe import RecipeError
from conftest import BLOG_MODEL_KEYS, MODEL_KEYS

# Bounds on the float image in [0, 1] against the fp32 baseline, measured on the four tiny
# models at 2 steps by tools/measure_bounds.py (issue 13). Max abs difference:
#   SDPA, sdpa-math, fused QKV, 1x1 swap: 0 - 4.0e-6; channels_last: 5e-7 - 6.9e-6; no_sync: 0
#   bf16: 0.013 - 0.052 (PSNR 42.7 - 51.6 dB); bf16 + int8 on every linear: 0.016 - 0.058
#   (PSNR 41.7 - 50.0 dB), and int8 against bf16 alone: 0.016 - 0.074.
# A lower bound far above the same-math noise proves a numeric technique changed the numbers.
EXACT_MATH = 2e-5     # techniques that must not change the math (3x the largest measured)
COMPILED_TOL = 1e-4   # inductor may reorder reductions (slow test, not re-measured here)
BF16_MIN, BF16_TOL = 5e-3, 0.1
# the linears fed one row per image, by the names the one-row test below finds
ONE_ROW = ("time_embedding", "add_embedding", "time_emb_proj", "adaln_single")
INT8_MIN, INT8_TOL = 5e-3, 0.15   # INT8_MIN against bf16 alone: quantization changed numbers
PSNR_RANGE = (38, 60)             # bf16 and int8 against fp32, dB


def psnr(a, b):
    return 10 * np.log10(1 / np.mean((a - b) ** 2))


def fresh(model):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


def image(pipe, seed=0):
    kwargs = fdh.call_kwargs(pipe, steps=2, seed=seed)
    kwargs["output_type"] = "np"
    with torch.inference_mode():
        return pipe(**kwargs).images[0].astype(np.float64)


@pytest.fixture(scope="module")
def baselines():
    return {m: image(fdh.apply(fresh(m), fdh.Recipe())) for m in BLOG_MODEL_KEYS}


SAME_MATH = {
    "sdpa": fdh.Recipe(attention="sdpa"),
    "sdpa-math": fdh.Recipe(attention="sdpa-math"),
    "fused QKV": fdh.Recipe(attention="sdpa", fuse_qkv=True),
    "fused QKV + sdpa-math": fdh.Recipe(attention="sdpa-math", fuse_qkv=True),
    "channels_last": fdh.Recipe(channels_last=True),
    "no_sync": fdh.Recipe(no_sync=True),
    "conv1x1_to_linear": fdh.Recipe(conv1x1_to_linear=True),
}


@pytest.mark.parametrize("model", BLOG_MODEL_KEYS)  # the fp32 classic baseline: not Flux's
@pytest.mark.parametrize("name", list(SAME_MATH))
def test_math_preserving_steps_match_the_fp32_baseline(model, name, baselines):
    out = image(fdh.apply(fresh(model), SAME_MATH[name]))
    assert np.abs(out - baselines[model]).max() <= EXACT_MATH


@pytest.mark.parametrize("model", BLOG_MODEL_KEYS)
def test_bf16_and_int8_stay_finite_and_close(model, baselines):
    bf16 = image(fdh.apply(fresh(model), fdh.Recipe(dtype="bf16", attention="sdpa")))
    assert np.isfinite(bf16).all()
    assert BF16_MIN < np.abs(bf16 - baselines[model]).max() <= BF16_TOL
    assert PSNR_RANGE[0] < psnr(bf16, baselines[model]) < PSNR_RANGE[1]
    with pytest.warns(UserWarning, match="without torch.compile"):
        pipe = fdh.apply(fresh(model), fdh.Recipe(dtype="bf16", attention="sdpa",
                                                  quantize="int8-dynamic", quant_filter="all"))
    raw = fresh(model)
    every = sum(isinstance(m, torch.nn.Linear) for part in (get_denoiser(raw), raw.vae)
                for m in part.modules())
    one_row = sum(isinstance(m, torch.nn.Linear) and any(p in n for p in ONE_ROW)
                  for n, m in get_denoiser(raw).named_modules())
    # every linear but those fed one row per image (the int8 kernel rule, issue 61)
    assert one_row > 0 and fdh.pipeline_info(pipe).applied["quantize"]["linears"] == every - one_row
    int8 = image(pipe)
    assert np.isfinite(int8).all()
    assert np.abs(int8 - baselines[model]).max() <= INT8_TOL
    assert PSNR_RANGE[0] < psnr(int8, baselines[model]) < PSNR_RANGE[1]
    assert np.abs(int8 - bf16).max() > INT8_MIN  # the weights really were quantized


def test_fastdiff_filter_skips_small_and_few_token_linears():
    unet = fdh.load_pipeline("sdxl", weights="random", device="meta").unet
    chosen = {n for n, m in unet.named_modules() if fdh.techniques.fastdiff_filter(m, n)}
    assert "down_blocks.2.attentions.0.transformer_blocks.0.attn1.to_q" in chosen  # 1280x1280
    assert "down_blocks.2.attentions.0.transformer_blocks.0.attn2.to_k" not in chosen  # 77 tokens
    assert "time_embedding.linear_1" not in chosen
    assert "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q" not in chosen  # 640x640
    assert len(chosen) > 100
    # tiny models have only small linears: our filter quantizes none of them, and says so
    with pytest.warns(UserWarning, match="selected no linear"):
        fdh.quantize(fdh.set_precision(fresh("sd15"), "bf16"), "int8-dynamic", "fastdiff")


@pytest.mark.parametrize("model", ["sd15", "sdxl", "pixart", "flux"])
def test_int8_leaves_out_every_linear_fed_one_row_per_image(model):
    """Issue 61: compiled int8 dynamic runs torch._int_mm, which CUDA refuses for 16 rows or
    fewer, and SDXL's '+ int8 dynamic' failed on the H200 ('self.size(0) needs to be greater
    than 16, but got 2') with each ResNet block's time_emb_proj selected. Every linear of the
    model's own structure fed one row per image (the batch: 2 with guidance, Flux's 1), at two
    sizes, is one the int8 kernel rule leaves out, whatever the filter, and so does the
    course's own filter, whatever its size."""
    pipe = fresh(model)
    rows: dict[str, set[int]] = {}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, name=name: rows.setdefault(name, set()).add(
            args[0].numel() // args[0].shape[-1]))
        for name, m in get_denoiser(pipe).named_modules() if isinstance(m, torch.nn.Linear)]
    for size in (64, 128):
        kwargs = fdh.call_kwargs(pipe, steps=2, height=size, width=size)
        kwargs["output_type"] = "latent"
        with torch.inference_mode():
            pipe(**kwargs)
    for hook in hooks:
        hook.remove()
    one_row = {name for name, seen in rows.items() if max(seen) <= 2}
    assert one_row, rows  # the timestep's projections at least
    big = torch.nn.Linear(1280, 1280, device="meta")  # a real model's size, past the size rule
    for name in ("all", "blog", "fastdiff"):
        chosen = quantization.select_filter("int8-dynamic", name)
        assert not any(chosen(big, fqn) for fqn in one_row), (name, one_row)
    if model != "flux":  # the course's filter is written for the UNets and PixArt
        assert not any(fdh.techniques.fastdiff_filter(big, fqn) for fqn in one_row)
    many = {name for name, seen in rows.items() if min(seen) > 16}
    assert all(quantization.int8_kernel_ok(big, fqn) for fqn in many)  # the rest stay in


def test_conv1x1_swap_counts_and_is_safe_twice():
    pipe = fresh("sd15")
    fdh.conv1x1_to_linear(pipe, "all")
    first = fdh.pipeline_info(pipe).applied["conv1x1_to_linear"]
    assert first["swapped"] > 0
    assert not any(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)
                   for m in pipe.unet.modules())
    fdh.conv1x1_to_linear(pipe, "all")
    assert fdh.pipeline_info(pipe).applied["conv1x1_to_linear"] == first


def test_precision_sets_true_fp32_and_tf32():
    pipe = fresh("sd15")
    fdh.set_precision(pipe, "tf32")
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    assert torch.backends.cudnn.fp32_precision == "tf32"  # the level inductor reads
    fdh.set_precision(pipe, "fp32")
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cudnn.fp32_precision == "ieee"
    fdh.set_precision(pipe, "bf16")
    assert pipe.unet.dtype == torch.bfloat16 and pipe.text_encoder.dtype == torch.bfloat16


def test_ladder_changes_what_the_blog_changed_per_step():
    names = [name for name, _ in fdh.course.LADDER]
    assert names == ["fp32", "bf16", "+ SDPA", "+ compile", "+ fused QKV", "+ int8 dynamic"]
    assert fdh.course.LADDER[0][1] == fdh.Recipe(dtype="fp32", tf32="blog", attention="classic")
    expected = [{"dtype"}, {"attention"},
                {"compile", "fullgraph", "inductor_flags", "channels_last",
                 "conv1x1_to_linear"},  # the blog's compile step
                {"fuse_qkv"}, {"quantize"}]
    for (_, before), (_, after), changed in zip(fdh.course.LADDER, fdh.course.LADDER[1:], expected):
        assert set(after.changes(before)) == changed
    assert all(not r.no_sync and r.dtype != "tf32" for _, r in fdh.course.LADDER)  # nothing hidden


CODE_RECIPES = [
    fdh.Recipe(),
    fdh.Recipe(dtype="bf16", attention="sdpa-math", fuse_qkv=True, channels_last=True,
               no_sync=True, conv1x1_to_linear=True),
    fdh.Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True, quantize="int8-dynamic",
               quant_filter="all"),
    fdh.Recipe(dtype="tf32", attention="sdpa"),
    # the blog's filters (int8 guard included), the guide's TF32 switch
    fdh.Recipe(dtype="bf16", tf32="guide", attention="sdpa", conv1x1_to_linear="blog",
               fuse_qkv=True, quantize="int8-dynamic", quant_filter="blog"),
]


@pytest.mark.parametrize("model", ["sdxl", "pixart"])
@pytest.mark.parametrize("index", range(len(CODE_RECIPES)))
@pytest.mark.parametrize("flavour", ["fdh", "plain"])
def test_to_code_executes_to_the_same_image_as_apply(model, index, flavour):
    recipe = CODE_RECIPES[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = image(fdh.apply(fresh(model), recipe))
        code = fdh.to_code(recipe, flavour)
        namespace = {"pipe": fresh(model)}
        exec(compile(code, f"<to_code {flavour}>", "exec"), namespace)
    if flavour == "plain":
        assert "fastdiff_helpers" not in code and "fdh." not in code
    assert np.array_equal(image(namespace["pipe"]), expected)


def test_invalid_values_fail_on_construction_with_what_to_do():
    with pytest.raises(RecipeError, match="Unknown dtype 'fp8'.*'fp32'"):
        fdh.Recipe(dtype="fp8")
    with pytest.raises(RecipeError, match="Unknown attention 'xformers'"):
        fdh.Recipe(attention="xformers")
    with pytest.raises(RecipeError, match="Unknown compile 'fast'"):
        fdh.Recipe(compile="fast")
    with pytest.raises(RecipeError, match="fuse_qkv needs an SDPA attention"):
        fdh.Recipe(fuse_qkv=True)
    with pytest.raises(RecipeError, match="inductor_flags=True needs compile"):
        fdh.Recipe(inductor_flags=True)
    with pytest.raises(RecipeError, match="set dtype='bf16'"):
        fdh.Recipe(quantize="int8-dynamic")


@pytest.mark.parametrize("recipe, message", [
    (fdh.Recipe(dtype="bf16", attention="sdpa", quantize="fp8-dynamic", compile="default"),
     "fp8-dynamic needs a GPU with fp8"),
    (fdh.Recipe(dtype="bf16", attention="sdpa-flash"), "CUDA kernel.*'sdpa-math'"),
])
def test_device_checks_refuse_before_any_work(recipe, message):
    pipe = fresh("sd15")
    with pytest.raises(RecipeError, match=message):
        fdh.apply(pipe, recipe)
    assert pipe.unet.dtype == torch.float32 and not fdh.pipeline_info(pipe).applied


def test_for_device_adapts_cuda_only_compile_and_says_so():
    recipe, notes = fdh.course.LADDER[3][1].for_device("cpu")
    assert recipe.compile == "max-autotune-no-cudagraphs" and "CUDA graphs" in notes[0]
    assert fdh.course.LADDER[3][1].for_device("cuda:0") == (fdh.course.LADDER[3][1], [])


@pytest.mark.parametrize("mode, runs", [("max-autotune", "max-autotune-no-cudagraphs"),
                                        ("reduce-overhead", "default")])
def test_apply_and_compile_pipeline_follow_the_one_policy_on_a_cpu(mode, runs, capsys):
    """docs/helpers.md's one-screen block on a CPU: apply() runs the CUDA-graph mode without the
    graphs, says so, records what ran (and what was asked, so asking again is a no-op), and the
    Result carries the note; compile_pipeline alone does the same. Nothing compiles until a
    call, so this is quick."""
    asked = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode)
    pipe = fdh.apply(fresh("sd15"), asked)
    info = fdh.pipeline_info(pipe)
    assert info.recipe.compile == runs and info.requested == asked
    assert info.applied["compile"]["mode"] == runs
    assert f"fastdiff: compile={mode!r} on cpu: ran compile={runs!r}" in capsys.readouterr().out
    assert fdh.apply(pipe, asked) is pipe  # the same request again: nothing to do
    assert fdh.current_recipe(pipe)["compile"] == runs
    alone = fdh.compile_pipeline(fresh("sd15"), mode)
    assert fdh.pipeline_info(alone).applied["compile"]["mode"] == runs
    assert f"ran compile={runs!r}" in capsys.readouterr().out


def test_apply_twice_is_safe_or_refused():
    pipe = fresh("sd15")
    recipe = fdh.Recipe(attention="sdpa", fuse_qkv=True)
    fdh.apply(pipe, recipe)
    before = image(pipe)
    assert fdh.apply(pipe, recipe) is pipe and np.array_equal(image(pipe), before)
    assert fdh.pipeline_info(pipe).recipe == recipe
    with pytest.raises(RecipeError, match="already has a recipe"):
        fdh.apply(pipe, fdh.Recipe(dtype="bf16"))
    fdh.fuse_qkv(pipe)  # fusing again is a no-op
    assert np.array_equal(image(pipe), before)


def test_order_mistakes_are_refused():
    pipe = fdh.set_precision(fresh("sd15"), "bf16")
    fdh.quantize(pipe, "int8-dynamic", "all")
    with pytest.raises(RecipeError, match="fuse_qkv must come before quantize"):
        fdh.fuse_qkv(pipe)
    with pytest.raises(RecipeError, match="already quantized"):
        fdh.quantize(pipe, "int8-dynamic", "all")
    with pytest.raises(RecipeError, match="needs an SDPA attention"):
        fdh.fuse_qkv(fdh.set_attention(fresh("sd15"), "classic"))


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_denoisers_trace_with_zero_graph_breaks(model):
    recipe = fdh.Recipe(dtype="fp32", attention="sdpa", fuse_qkv=True, channels_last=True,
                        no_sync=True)
    report = fdh.graph_breaks(fdh.apply(fresh(model), recipe), verbose=False)
    assert report["graph_breaks"] == 0 and report["graphs"] == 1 and report["ops"] > 50


def test_count_syncs_on_cpu_says_it_needs_a_gpu(capsys):
    assert fdh.count_syncs(fresh("sd15")) is None
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_no_sync_keeps_scheduler_state_on_cpu():
    pipe = fdh.remove_syncs(fresh("sd15"))  # PNDM: the one scheduler diffusers leaves syncing
    pipe.scheduler.set_timesteps(4, device="cuda")  # the pipeline asks for its device...
    assert pipe.scheduler.timesteps.device.type == "cpu"  # ...the scheduler stays on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("model, scope", [("sd15", "full"), ("pixart", "regional-extended")])
def test_compiled_denoiser_matches_baseline_fullgraph(model, scope, baselines):
    recipe = fdh.Recipe(attention="sdpa", compile="default", compile_scope=scope,
                        fullgraph=True, inductor_flags=True, channels_last=True,
                        compile_vae=scope == "full")
    pipe = fdh.apply(fresh(model), recipe)
    out = image(pipe)
    assert np.abs(out - baselines[model]).max() <= COMPILED_TOL
    with pytest.raises(RecipeError, match="already compiled"):
        fdh.compile_pipeline(pipe, mode="default")


def test_current_recipe_reads_what_is_really_applied():
    raw = fresh("sdxl")  # diffusers loads SDPA processors: a raw pipeline is not the baseline
    assert fdh.current_recipe(raw)["attention"] == "sdpa"
    pipe = fdh.set_precision(fresh("sdxl"), "bf16")
    fdh.fuse_qkv(pipe)
    fdh.set_attention(pipe, "sdpa-math")
    fdh.remove_syncs(pipe)
    d = fdh.current_recipe(pipe)
    assert (d["dtype"], d["attention"], d["fuse_qkv"], d["no_sync"], d["compile"]) == \
        ("bf16", "sdpa-math", True, True, None)
    assert fdh.Recipe.from_dict(d) == fdh.Recipe(dtype="bf16", attention="sdpa-math",
                                                 fuse_qkv=True, no_sync=True)
    applied = fdh.apply(fresh("sd15"), fdh.course.LADDER[1][1])
    assert fdh.current_recipe(applied) == fdh.course.LADDER[1][1].to_dict()


def test_check_device_reads_nothing_from_cuda_for_cpu_devices():
    # capability is only looked up for CUDA devices asked for fp8
    fdh.Recipe(attention="sdpa").check_device("cpu")
    with pytest.raises(RecipeError, match="this has cpu"):
        fdh.Recipe(dtype="bf16", attention="sdpa", quantize="fp8-dynamic").check_device("cpu")


def test_to_code_only_keeps_the_named_sections_of_the_full_code():
    """A notebook shows one technique's lines: to_code(..., only=...) is the header it needs
    (`import torch`, the denoiser's name) plus those sections, each exactly as the full plain
    code has it."""
    from fastdiff_helpers.techniques.codegen import _DENOISER, SECTIONS

    recipe = dataclasses.replace(fdh.course.LADDER[5][1], no_sync=True, cache_every=3,
                                 guidance_stop=0.5)  # every section (09_fewer_denoiser_calls)
    full = fdh.to_code(recipe, "plain")
    assert full.startswith("import torch\n\n" + _DENOISER + "\n\n")
    # diffusers' default SDPA processor is no step of its own: nothing to paste for it
    assert "AttnProcessor" not in full and "attention" not in fdh.to_code(
        fdh.Recipe(dtype="bf16", attention="sdpa"), "plain")
    assert "AttnProcessor()" in fdh.to_code(fdh.Recipe(), "plain", only="attention")
    for name in (n for n in SECTIONS if n != "attention"):
        part = fdh.to_code(recipe, "plain", only=name)
        blocks = part.split("\n\n")
        body = "\n\n".join(b for b in blocks if b not in ("import torch", _DENOISER))
        assert body.strip() and body.strip() in full, name
    both = fdh.to_code(recipe, "plain", only=["channels_last", "compile"])
    assert "denoiser.to(memory_format=torch.channels_last)" in both
    assert "options = {**list_mode_options('max-autotune')," in both and "quantize_" not in both
    with pytest.raises(RecipeError, match="no fuse_qkv step"):
        fdh.to_code(fdh.Recipe(), "plain", only="fuse_qkv")
    with pytest.raises(RecipeError, match="Unknown section"):
        fdh.to_code(recipe, "plain", only="int8")
    with pytest.raises(RecipeError, match="flavour='plain'"):
        fdh.to_code(recipe, "fdh", only="compile")
