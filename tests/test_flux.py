"""Flux.1, the fifth model (issue 37): FLUX.1-dev and -schnell from the three weight sources,
their counts on the meta device, the scheduler's dynamic shift, the Flux filter, attention,
fused QKV, the step cache, what is refused and why, diffusers' cache hooks against the course's
step cache, and the reference run taking the Flux ladder. Tiny models on the CPU, full size on
meta. (Flux also runs the tests parametrized over conftest.MODEL_KEYS.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.models.build import build_component
from fastdiff_helpers.techniques import quantization
from fastdiff_helpers.techniques.recipe import RecipeError

EXACT_MATH = 2e-5  # test_techniques.py: the same-math bound on the float image


def fresh(model="flux"):
    return fdh.load_pipeline(model, weights="tiny", device="cpu", verbose=False)


def image(pipe, steps=2, seed=0):
    kwargs = fdh.call_kwargs(pipe, steps=steps, seed=seed)
    kwargs["output_type"] = "np"
    with torch.inference_mode():
        return pipe(**kwargs).images[0].astype(np.float64)


@pytest.fixture(scope="module")
def meta():
    return fdh.load_pipeline("flux", weights="random", device="meta", verbose=False)


# --- the model: counts, configs, scheduler -------------------------------------------------

def test_full_size_counts_on_meta(meta):
    counts = fdh.count_parameters(meta)
    assert counts["transformer"] == 11_901_408_320          # published: "12 billion"
    assert round(counts["transformer"] / 1e9) == 12
    assert counts["vae"] == 83_819_683                      # no figure published: counted
    assert counts["text_encoder"] == 123_060_480            # CLIP ViT-L/14, as SD's
    assert counts["text_encoder_2"] == 4_762_310_656        # T5-XXL encoder, as PixArt's
    assert meta.vae.config.latent_channels == 16 and meta.vae_scale_factor == 8
    # schnell: the same transformer without the guidance embedder (two linears 256->3072->3072)
    schnell = build_component(fdh.MODELS["flux-schnell"].full["transformer"], "meta",
                              torch.float32)
    guidance = meta.transformer.time_text_embed.guidance_embedder
    assert sum(p.numel() for p in schnell.parameters()) == 11_891_178_560
    assert 11_901_408_320 - 11_891_178_560 == sum(p.numel() for p in guidance.parameters())
    # its weights: 4 bytes each here (fp32 on meta), 2 in bf16: 33.7 GB, a 40 GB+ card
    assert sum(fdh.weight_bytes(meta).values()) == 4 * counts["total"]
    assert 2 * counts["total"] == 33_741_198_278


def test_linears_filters_and_kernels_on_meta(meta):
    t = meta.transformer
    linears = {n: m for n, m in t.named_modules() if isinstance(m, torch.nn.Linear)}
    assert len(linears) == 504
    flux = quantization.select_filter("fp8-dynamic", "flux")
    assert sum(flux(m, n) for n, m in linears.items()) == 504  # every one: the kernels take all
    assert all(quantization.fp8_kernel_ok(m) and quantization.int8_kernel_ok(m)
               for m in linears.values())
    vae = [(n, m) for n, m in meta.vae.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(vae) == 8 and not any(flux(m, n) for n, m in vae)  # the VAE's stay in bf16
    # the adaLN modulation linears: one row each, 3.25 of the 11.9 billion parameters
    adaln = [m for n, m in linears.items() if n.endswith(("norm1.linear", "norm1_context.linear",
                                                          "norm.linear", "norm_out.linear"))]
    assert len(adaln) == 19 * 2 + 38 + 1
    assert sum(p.numel() for m in adaln for p in m.parameters()) == 3_247_448_064
    # the course's UNet/PixArt filter keeps them (its one-token names are not Flux's)
    fastdiff = quantization.select_filter("fp8-dynamic", "fastdiff")
    assert sum(fastdiff(m, n) for n, m in linears.items()) == 500
    # channels_last is not in Flux's ladder: no tensor of its transformer is 4-D
    assert max(p.ndim for p in list(t.parameters()) + list(t.buffers())) == 2


def test_schedulers_shift_as_the_hub_configs_say():
    dev, schnell = fresh("flux"), fresh("flux-schnell")
    cfg = dev.scheduler.config
    assert type(dev.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    assert (cfg.use_dynamic_shifting, cfg.base_shift, cfg.max_shift, cfg.base_image_seq_len,
            cfg.max_image_seq_len, cfg.shift) == (True, 0.5, 1.15, 256, 4096, 3.0)
    assert (schnell.scheduler.config.use_dynamic_shifting, schnell.scheduler.config.shift) == \
        (False, 1.0)
    # the tiny 64x64 image is 16 tokens: mu = 0.5 + (16 - 256) * 0.65 / 3840 (pipeline_flux.py:
    # calculate_shift); the sigmas are exp(mu) / (exp(mu) + 1/t - 1) of linspace(1, 1/4, 4)
    image(dev, steps=4)
    mu = 0.5 + (16 - 256) * (1.15 - 0.5) / (4096 - 256)
    t = np.linspace(1.0, 0.25, 4)
    expected = np.exp(mu) / (np.exp(mu) + (1 / t - 1))
    assert np.allclose(dev.scheduler.sigmas[:-1].numpy(), expected, atol=1e-6)
    image(schnell, steps=4)  # no shift: the sigmas are the linspace itself
    assert np.allclose(schnell.scheduler.sigmas[:-1].numpy(), t, atol=1e-6)
    # at 1024x1024 (4096 tokens) mu is max_shift: 1.15
    assert 0.5 + (4096 - 256) * (1.15 - 0.5) / (4096 - 256) == pytest.approx(1.15)


def test_guidance_is_an_input_and_the_batch_stays_1():
    seen = {}
    for key, scale in (("flux", 3.5), ("flux-schnell", 0.0)):
        pipe = fresh(key)
        pipe.transformer.register_forward_pre_hook(
            lambda m, a, kw, key=key: [seen.setdefault(key, kw.get("guidance")), None][1],
            with_kwargs=True)
        assert [b for _, _, b in fdh.trace_steps(pipe, steps=3)] == [1, 1, 1]
        assert fdh.count_flops(pipe)["batch"] == 1 and fdh.MODELS[key].guidance == scale
    assert seen["flux"].tolist() == [3.5] and seen["flux-schnell"] is None
    assert fdh.call_kwargs(fresh("flux-schnell"))["max_sequence_length"] == 256
    assert fdh.MODELS["flux"].size_multiple == 16  # 8 (the VAE) x 2 (the pipeline's packing)
    with pytest.raises(fdh.FastdiffError, match="multiple of 16"):
        fdh.call_kwargs(fresh("flux"), height=72)


def test_a_saved_tiny_flux_loads_back_as_pretrained(tmp_path):
    pipe = fresh("flux-schnell")
    pipe.save_pretrained(tmp_path)
    again = fdh.load_pipeline("flux-schnell", path=str(tmp_path), device="cpu", verbose=False)
    assert fdh.pipeline_info(again).weights == "pretrained"
    # its size comes from its VAE's config (FluxPipeline's own default is 1024 px)
    assert again.default_sample_size == 8 and fdh.call_kwargs(again)["height"] == 64
    # the same math (measured 1.9e-6: fp32's last bits; a uint8 pixel may round the other way)
    assert np.abs(image(pipe) - image(again)).max() <= EXACT_MATH
    # a FluxPipeline made by plain diffusers is described by its transformer
    from diffusers import FluxPipeline

    plain = FluxPipeline.from_pretrained(str(tmp_path))
    assert fdh.pipeline_info(plain).model == "flux-schnell"


# --- what does not apply, refused before any work -----------------------------------------

REFUSED = {
    "classic": (dict(), "transformer_flux.py:279-283"),
    "guidance_stop": (dict(attention="sdpa", guidance_stop=0.5), "pipeline_flux.py:847-851"),
    "blog": (dict(dtype="bf16", attention="sdpa", quantize="int8-dynamic"), "blog ran no Flux"),
    "regional-extended": (dict(attention="sdpa", compile="default",
                               compile_scope="regional-extended"), "transformer_flux.py:572"),
}


@pytest.mark.parametrize("what", list(REFUSED))
def test_what_does_not_apply_is_refused_before_any_work(what):
    change, cited = REFUSED[what]
    recipe = fdh.Recipe(**change)
    pipe = fresh()
    with pytest.raises(RecipeError, match=cited):
        fdh.apply(pipe, recipe)
    assert fdh.pipeline_info(pipe).applied == {}  # nothing was done
    with pytest.raises(RecipeError, match=cited):
        fdh.to_code(recipe, "plain", model="flux")


def test_each_technique_alone_refuses_too_and_what_applies_runs():
    with pytest.raises(RecipeError, match="does not exist for Flux"):
        fdh.set_attention(fresh(), "classic")
    with pytest.raises(RecipeError, match="runs none"):
        fdh.stop_guidance(fresh(), 0.5)
    with pytest.raises(RecipeError, match="blog ran no Flux"):
        fdh.quantize(fdh.set_precision(fresh(), "bf16"), "int8-dynamic", "blog")
    with pytest.raises(RecipeError, match="leaves none"):
        fdh.compile_pipeline(fresh(), "default", scope="regional-extended")
    with pytest.raises(RecipeError, match="no Flux"):
        fdh.quantize(fdh.set_precision(fresh("sd15"), "bf16"), "int8-dynamic", "flux")
    # the text encoders freed: Flux's embeddings (T5's and CLIP's pooled one) stand in
    pipe = fresh()
    expected = image(pipe)
    embeds = fdh.apply_memory_saver(pipe, "text-encoders-freed", prompt=fdh.models.presets
                                    .DEFAULT_PROMPT)
    assert set(embeds) == {"prompt_embeds", "pooled_prompt_embeds"}
    assert pipe.text_encoder is None and embeds["prompt_embeds"].shape[1] == 512
    kwargs = fdh.call_kwargs(pipe, steps=2)
    kwargs.pop("prompt")
    kwargs["output_type"] = "np"
    with torch.inference_mode():
        freed = pipe(**kwargs, **embeds).images[0]
    assert np.abs(freed - expected).max() <= EXACT_MATH
    # the sync removal applies and finds nothing to do (no sync in Flux's loop)
    pipe = fdh.remove_syncs(fresh())
    assert fdh.pipeline_info(pipe).applied["no_sync"]["changed"] is False


def test_ladders_are_refused_where_they_were_not_written():
    with pytest.raises(fdh.FastdiffError, match="ran no Flux"):
        fdh.course.run_ladder("flux", ladder="blog", weights="tiny", device="cpu")
    with pytest.raises(fdh.FastdiffError, match="classic attention"):
        fdh.course.run_ladder("flux", ladder="course", weights="tiny", device="cpu")
    with pytest.raises(fdh.FastdiffError, match="written for Flux"):
        fdh.course.run_ladder("sd15", ladder="flux", weights="tiny", device="cpu")
    steps = fdh.course.LADDERS["flux"]
    assert [n for n, _ in steps] == ["bf16", "+ compile", "+ fp8 dynamic", "+ fp8 dynamic row"]
    for (_, before), (_, after) in zip(steps, steps[1:]):
        assert len(after.changes(before)) <= 3  # compile, fullgraph, compile_vae go together
    assert steps[2][1].changes(steps[1][1]) == ["quantize", "quant_filter"]
    assert steps[3][1].changes(steps[2][1]) == ["quantize"]
    assert not any(r.channels_last or r.inductor_flags or r.compile_vae for _, r in steps[1:])


# --- what applies: attention, fused QKV, the plain code ------------------------------------

def test_attention_backends_are_diffusers_own_and_change_no_default():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    active = _AttentionBackendRegistry.get_active_backend()[0]
    sdpa = image(fdh.set_attention(fresh(), "sdpa"))
    pipe = fdh.set_attention(fresh(), "sdpa-math")
    backends = {p._attention_backend.value for p in pipe.transformer.attn_processors.values()}
    assert backends == {"_native_math"}
    assert fdh.pipeline_info(pipe).attention_pinned == {"FluxTransformer2DModel": 4,
                                                           "AutoencoderKL": 2}
    assert fdh.current_recipe(pipe)["attention"] == "sdpa-math"
    assert np.abs(image(pipe) - sdpa).max() <= EXACT_MATH
    assert _AttentionBackendRegistry.get_active_backend()[0] == active  # no process-wide change
    with pytest.raises(RecipeError, match="runs only in"):
        fdh.set_attention(fresh(), "sdpa-flash")  # fp32: flash takes bf16/fp16 only


def test_fused_qkv_uses_the_fused_projections_and_keeps_the_count():
    plain = fresh()
    before = fdh.count_parameters(plain)["transformer"]
    expected = image(plain)
    pipe = fdh.apply(fresh(), fdh.Recipe(attention="sdpa", fuse_qkv=True))
    double = pipe.transformer.transformer_blocks[0].attn
    single = pipe.transformer.single_transformer_blocks[0].attn
    assert double.to_qkv.out_features == 3 * 32 and double.to_added_qkv.out_features == 3 * 32
    assert not any(hasattr(double, n) for n in ("to_q", "add_q_proj", "add_v_proj"))
    assert hasattr(single, "to_qkv") and not hasattr(single, "to_k")
    assert fdh.count_parameters(pipe)["transformer"] == before  # the unfused copies dropped
    assert np.abs(image(pipe) - expected).max() <= EXACT_MATH


def test_plain_code_is_what_apply_does():
    recipe = fdh.Recipe(dtype="bf16", attention="sdpa-math", fuse_qkv=True,
                        quantize="int8-dynamic", quant_filter="flux")
    code = fdh.to_code(recipe, "plain", model="flux")
    assert "set_attention_backend('_native_math')" in code and "FLUX_PARTS" in code
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = fdh.apply(fresh(), recipe)
        plain = fresh()
        exec(code, {"pipe": plain})  # noqa: S102 (the course's own code)
    linears = [m for m in plain.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(type(m.weight) is not torch.nn.Parameter for m in linears) == \
        fdh.pipeline_info(applied).applied["quantize"]["linears"] == 25  # 38 less 13 fed one row
    assert np.array_equal(image(plain), image(applied))


# --- fewer transformer calls: diffusers' hooks against the course's step cache -------------

def test_cache_hooks_against_the_step_cache():
    """Tiny model, 8 steps: what each runs, reads on the host and compiles (dynamo)."""
    rows = {r["cache"].split("(")[0]: r for r in fdh.course.cache_hooks_report(runs=1, verbose=False)}
    none, fbc = rows["none"], rows["FirstBlockCache"]
    taylor, ours = rows["TaylorSeer"], rows["fdh.step_cache"]
    assert (none["last block attention"], none["host reads"], none["frames"]) == (8, 0, 1)
    # FirstBlockCache: a relative-change test on the host each step after the first
    # (first_block_cache.py:139-141, .item()), in a torch.compiler.disable'd function (:133)
    assert (fbc["last block attention"], fbc["last block MLP"], fbc["host reads"]) == (4, 4, 7)
    assert "torch.compiler.disable" in fbc["fullgraph"] and fbc["frames"] > 2
    # TaylorSeer (default identifiers): the attentions only, predicted on 3 of 8 steps; its
    # step counter lives in a disabled function too (taylorseer_cache.py:227-236)
    assert (taylor["last block attention"], taylor["last block MLP"]) == (5, 8)
    assert taylor["host reads"] == 0 and "torch.compiler.disable" in taylor["fullgraph"]
    assert taylor["graph breaks"] > 0
    # the course's step cache: steps 0, 3, 6 whole, fullgraph, two frames, nothing again
    assert (ours["last block attention"], ours["last block MLP"], ours["host reads"]) == (3, 3, 0)
    assert ours["fullgraph"] == "compiles"
    assert (ours["frames"], ours["graph breaks"], ours["recompiles"]) == (2, 0, 0)
    for row in (fbc, taylor, ours):
        assert 0 < row["max_abs"] < 0.1  # they move the tiny model's numbers, a little


def test_step_cache_flops_and_branches():
    pipe = fdh.step_cache(fresh(), every=3, branch=2)
    counted = fdh.count_flops(pipe, steps=8)
    assert counted["schedule"] == ["full/1", "cached/1", "cached/1"] * 2 + ["full/1",
                                                                            "cached/1"]
    full = counted["denoiser_per_forward"]
    cached = (counted["denoiser_total"] - 3 * full) / 5
    assert 0 < cached < 0.75 * full  # 2 of 4 blocks, and the embeddings, on a cached step
    with pytest.raises(RecipeError, match="takes 1 to 3"):
        fdh.step_cache(fresh(), every=3, branch=4)


# --- the reference run takes Flux and its ladder ------------------------------------------

def test_reference_run_takes_flux_and_its_ladder(tmp_path, capsys):
    from tools.reference.__main__ import main

    out = tmp_path / "results" / "cpu" / "flux"  # under results/: the run tables it there
    code = main(["--model", "flux", "--weights", "tiny", "--device", "cpu",
                 "--out", str(out), "--budget-s", "60", "--runs", "1", "--warmup", "1",
                 "--steps", "2", "--no-progress", "--no-tuning"])
    said = capsys.readouterr().out
    assert code == 3, said  # bf16 measured; the compiled step's first guess exceeds what is left
    records = fdh.load_results(out / "results.jsonl")
    assert [r.step for r in records] == ["bf16"] and records[0].error is None
    assert "(flux ladder" in said
    table = (tmp_path / "results" / "README.md").read_text()
    assert "flux ladder, tiny weights" in table and "| vs bf16 |" in table
