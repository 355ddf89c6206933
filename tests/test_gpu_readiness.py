"""GPU readiness (issue 11): what the first GPU run would hit, each decision pinned on the CPU."""

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.recipe import RecipeError


def fresh(model):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


def test_graph_breaks_keeps_other_compiled_pipelines():
    """torch._dynamo.explain() resets dynamo: every compiled model would recompile (or, after
    the reset, silently run a stale wrapper). graph_breaks must leave them alone."""
    compiled_graphs = []

    def backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    kept = fresh("sd15")
    kept.unet.compile(backend=backend)  # what compile_pipeline does, with a cheap backend
    call = fdh.call_kwargs(kept, steps=2)
    call["output_type"] = "latent"
    with torch.inference_mode():
        kept(**call)
    compiled = len(compiled_graphs)
    assert compiled >= 1
    report = fdh.graph_breaks(fresh("sd15"), verbose=False)  # same UNet class, another pipe
    assert report["graphs"] == 1 and report["graph_breaks"] == 0 and report["ops"] > 50
    with torch.inference_mode():
        kept(**call)
    assert len(compiled_graphs) == compiled  # no recompile: its cache survived
    again = fdh.graph_breaks(fresh("sd15"), verbose=False)  # repeatable, no stale entries
    assert again["graphs"] == 1 and again["ops"] == report["ops"]


@pytest.mark.parametrize("mode, runs", [("max-autotune", "max-autotune-no-cudagraphs"),
                                        ("reduce-overhead", "default")])
def test_regional_compile_never_captures_per_block_cuda_graphs(mode, runs):
    recipe = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode, compile_scope="regional")
    adapted, notes = recipe.for_device("cuda:0")
    assert adapted.compile == runs and adapted.compile_scope == "regional"
    assert adapted.changes(recipe) == ["compile"] and "152887" in notes[0]
    adapted.check_device("cuda:0")  # the adapted recipe passes
    with pytest.raises(RecipeError, match=f"compile='{runs}' with 'regional'"):
        recipe.check_device("cuda:0")  # fdh.apply refuses the original before any work
    full = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode)
    assert full.for_device("cuda:0") == (full, [])  # whole-denoiser graphs are fine
    assert recipe.for_device("cpu")[0].compile == "default"  # CPU: no graphs at all


def test_compile_pipeline_refuses_regional_cuda_graphs_on_cuda(monkeypatch):
    from fastdiff_helpers.techniques import compile as comp

    pipe = fresh("sd15")
    monkeypatch.setattr(comp, "pipeline_device", lambda p: torch.device("cuda", 0))
    with pytest.raises(RecipeError, match="152887"):
        fdh.compile_pipeline(pipe, mode="max-autotune", scope="regional")
    assert "compile" not in fdh.pipeline_info(pipe)["applied"]


# -- forced SDPA backends: pinned only where the kernel takes the shape, dtype and mask ------

FORCED = ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]


def attentions(module):
    from diffusers.models.attention_processor import Attention

    return [(n, m) for n, m in module.named_modules() if isinstance(m, Attention)]


@pytest.fixture(scope="module")
def meta_pipes():
    return {m: fdh.load_pipeline(m, weights="random", device="meta")
            for m in ("sdxl", "sd15", "ssd1b", "pixart")}


@pytest.mark.parametrize("kind", FORCED)
@pytest.mark.parametrize("model", ["sdxl", "sd15", "ssd1b", "pixart"])
def test_forced_backend_is_pinned_only_where_its_kernel_runs(model, kind, meta_pipes):
    from fastdiff_helpers.techniques.attention import (SDPA_BACKENDS, SDPA_LIMITS,
                                                       SDPABackendProcessor, masked_attentions)

    pipe = fdh.set_precision(meta_pipes[model], "bf16")
    if kind == "sdpa-flash" and model == "pixart":
        with pytest.raises(RecipeError, match="refuses an attention mask.*sdpa-efficient"):
            fdh.set_attention(pipe, kind)
        return
    fdh.set_attention(pipe, kind)
    backend = SDPA_BACKENDS[kind]
    limits = SDPA_LIMITS[backend]
    masked = set(masked_attentions(pipe))
    pinned = unpinned = 0
    for module in (fdh.get_denoiser(pipe), pipe.vae):
        for name, attn in attentions(module):
            head_dim = attn.inner_dim // attn.heads
            if isinstance(attn.processor, SDPABackendProcessor):
                pinned += 1
                assert attn.processor.backend == backend
                assert limits["max_head_dim"] is None or head_dim <= limits["max_head_dim"]
                assert head_dim % limits["multiple_of"] == 0
                assert str(attn.to_q.weight.dtype).removeprefix("torch.") in limits["dtypes"]
                assert limits["mask"] or (module is pipe.vae or name not in masked)
            else:
                unpinned += 1
                assert type(attn.processor).__name__ == "AttnProcessor2_0"  # default SDPA
    vae_heads = {attn.inner_dim // attn.heads for _, attn in attentions(pipe.vae)}
    assert vae_heads == {512}  # one 512-wide head in every VAE attention
    expected_unpinned = {  # the VAE's 2 (encoder, decoder); SD1.5's 160-wide heads for cuDNN
        ("sdpa-flash", "sd15"): 2, ("sdpa-cudnn", "sd15"): 2 + 12}.get((kind, model), 2)
    assert unpinned == (0 if kind == "sdpa-efficient" else expected_unpinned)
    assert pinned >= 20  # SD1.5 under cuDNN: 32 attentions less its 12 wide ones


def test_masked_attentions_are_the_ones_the_pipeline_masks():
    """The static list (PixArt's cross-attentions) against what a real call passes."""
    from fastdiff_helpers.techniques.attention import masked_attentions

    for model in ("pixart", "sdxl"):
        pipe = fresh(model)
        seen = set()

        class Spy:
            def __init__(self, name, inner):
                self.name, self.inner = name, inner

            def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                         attention_mask=None, **kw):
                if attention_mask is not None:
                    seen.add(self.name)
                return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask,
                                  **kw)

        for name, attn in attentions(fdh.get_denoiser(pipe)):
            attn.set_processor(Spy(name, attn.processor))
        call = fdh.call_kwargs(pipe, steps=2)
        call["output_type"] = "latent"
        with torch.inference_mode():
            pipe(**call)
        assert seen == set(masked_attentions(pipe))
        assert bool(seen) == (model == "pixart")


@pytest.mark.parametrize("kind", ["sdpa-flash", "sdpa-cudnn"])
@pytest.mark.parametrize("dtype", ["fp32", "tf32"])
def test_flash_and_cudnn_refuse_fp32(kind, dtype):
    with pytest.raises(RecipeError, match="fp16/bf16.*dtype='bf16'"):
        fdh.Recipe(dtype=dtype, attention=kind)
    pipe = fresh("sd15")  # fp32: the one-by-one call refuses too, before changing anything
    with pytest.raises(RecipeError, match="runs only in float16 or bfloat16"):
        fdh.set_attention(pipe, kind)
    assert "attention" not in fdh.pipeline_info(pipe)["applied"]
    fdh.Recipe(dtype="fp32", attention="sdpa-efficient")  # fp32 is fine there


def test_apply_refuses_flash_on_pixart_before_any_work(monkeypatch):
    pipe = fresh("pixart")
    monkeypatch.setattr(fdh.Recipe, "check_device", lambda self, device: None)  # as on a GPU
    with pytest.raises(RecipeError, match="refuses an attention mask"):
        fdh.apply(pipe, fdh.Recipe(dtype="bf16", attention="sdpa-flash"))
    assert pipe.transformer.dtype == torch.float32 and not fdh.pipeline_info(pipe)["applied"]


# -- fused QKV holds no more weights than the unfused model -------------------------------

def test_fused_qkv_keeps_the_parameter_count_of_full_size_sdxl():
    pipe = fdh.load_pipeline("sdxl", weights="random", device="meta")
    before = fdh.count_parameters(pipe)
    assert before["unet"] == 2_567_463_684  # shared/notes/facts.md
    fdh.fuse_qkv(fdh.set_attention(pipe, "sdpa"))
    after = fdh.count_parameters(pipe)
    for name in ("unet", "vae"):  # biases are concatenated, not added: the counts are equal
        assert after[name] == before[name], name
    unet = pipe.unet
    self_attn = unet.get_submodule("down_blocks.1.attentions.0.transformer_blocks.0.attn1")
    cross = unet.get_submodule("down_blocks.1.attentions.0.transformer_blocks.0.attn2")
    assert not hasattr(self_attn, "to_q") and self_attn.to_qkv.out_features == 3 * 640
    assert cross.to_q.out_features == 640 and not hasattr(cross, "to_k")
    assert fdh.current_recipe(pipe)["fuse_qkv"] is True


@pytest.mark.parametrize("model", ["sdxl", "pixart"])
@pytest.mark.parametrize("flavour", [None, "plain"])
def test_fused_tiny_pipelines_match_the_unfused_image(model, flavour):
    def image(pipe):
        kwargs = fdh.call_kwargs(pipe, steps=2, seed=0)
        kwargs["output_type"] = "np"
        with torch.inference_mode():
            return pipe(**kwargs).images[0].astype(np.float64)

    reference = image(fdh.set_attention(fresh(model), "sdpa"))
    recipe = fdh.Recipe(attention="sdpa", fuse_qkv=True)
    if flavour is None:
        pipe = fdh.apply(fresh(model), recipe)
    else:
        namespace = {"pipe": fresh(model)}
        exec(recipe.to_code("plain"), namespace)
        pipe = namespace["pipe"]
    unfused = fdh.count_parameters(fresh(model))
    assert fdh.count_parameters(pipe) == unfused
    assert np.abs(image(pipe) - reference).max() <= 1e-4


# -- peak memory: allocated vs reserved (CUDA-graph pools show only in reserved) -----------

def _memory_result(**kw):
    from fastdiff_helpers.results import Result

    fields = dict(model="sdxl", weights="random", step="+ compile", recipe={}, device_name="H100",
                  height=1024, width=1024, steps=30, latency_s=2.5, latency_samples=[2.5] * 3,
                  peak_memory_bytes=9 * 2**30, peak_memory_kind="cuda_max_allocated",
                  peak_reserved_bytes=12 * 2**30)
    fields.update(kw)
    return Result(**fields)


def test_reserved_memory_round_trips_and_old_records_load(tmp_path):
    import json

    from fastdiff_helpers.results import load_results, save_results

    path = tmp_path / "run.jsonl"
    save_results([_memory_result()], path)
    assert load_results(path)[0].peak_reserved_bytes == 12 * 2**30
    old = _memory_result().to_dict()
    del old["peak_reserved_bytes"]  # a record written before the field existed
    path.write_text(json.dumps(old) + "\n")
    loaded = load_results(path)[0]
    assert loaded.peak_reserved_bytes is None and loaded.peak_memory_bytes == 9 * 2**30
    assert "peak 9.0 GiB, reserved 12.0 GiB" in _memory_result().summary()


def test_table_and_chart_say_which_memory_is_which():
    results = [_memory_result(step="bf16", peak_reserved_bytes=10 * 2**30), _memory_result()]
    table = fdh.format_table(results)
    head = table.splitlines()[0]
    assert "peak allocated" in head and "peak reserved" in head
    assert "12.00 GiB" in table.splitlines()[3] and "9.00 GiB" in table.splitlines()[3]
    cpu = fdh.format_table([_memory_result(peak_memory_kind="process_peak_rss",
                                           peak_reserved_bytes=None)])
    assert "peak RSS" in cpu.splitlines()[0] and "reserved" not in cpu
    ax = fdh.memory_chart(results).axes[0]
    assert [b.get_height() for b in ax.containers[0]] == [9.0, 9.0]  # allocated
    assert [b.get_height() for b in ax.containers[1]] == [10.0, 12.0]  # reserved outline
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("allocated" in t for t in labels) and any("reserved" in t for t in labels)


def test_benchmark_on_a_cpu_has_no_reserved_memory():
    """The CUDA path (max_memory_reserved >= max_memory_allocated) is in tests/gpu."""
    result = fdh.benchmark(fresh("sd15"), steps=2, runs=1, warmup=0, progress=False)
    assert result.peak_memory_kind == "process_peak_rss" and result.peak_reserved_bytes is None


# -- weights="auto" picks "pretrained" only when every component's weights are cached ------

def _fake_cache(root, files):
    repo = root / "models--stabilityai--stable-diffusion-xl-base-1.0"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    for name in ["model_index.json", *files]:
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text("{}")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))  # read once at import
    return tmp_path


def test_auto_falls_back_when_only_model_index_is_cached(hf_cache):
    from fastdiff_helpers.loading import choose_weights

    _fake_cache(hf_cache, ["unet/config.json", "text_encoder/model.fp16.safetensors",
                           "vae/diffusion_pytorch_model.safetensors"])
    weights, why = choose_weights(fdh.MODELS["sdxl"], None, "cpu")
    assert weights == "tiny"
    assert "only partly cached" in why and "unet, text_encoder, text_encoder_2" in why
    assert choose_weights(fdh.MODELS["sdxl"], None, "cuda")[0] == "random"


def test_auto_picks_pretrained_when_every_component_is_cached(hf_cache):
    from fastdiff_helpers.loading import choose_weights

    _fake_cache(hf_cache, ["unet/diffusion_pytorch_model.safetensors",
                           "vae/diffusion_pytorch_model.safetensors",
                           "text_encoder/model.safetensors",
                           "text_encoder_2/model-00001-of-00002.safetensors"])
    weights, why = choose_weights(fdh.MODELS["sdxl"], None, "cpu")
    assert weights == "pretrained" and "in the local Hugging Face cache" in why


# -- no_sync: decided per pipeline and scheduler, as diffusers 0.42 runs them --------------

@pytest.mark.parametrize("model, scheduler, changed", [
    ("sdxl", "EulerDiscreteScheduler", False),   # sigmas on the CPU, begin index set
    ("ssd1b", "EulerDiscreteScheduler", False),
    ("sd15", "PNDMScheduler", True),             # indexes CPU alphas with a GPU timestep
    ("pixart", "DPMSolverMultistepScheduler", False),  # blocking .to() of a CPU timestep
])
def test_no_sync_does_per_scheduler_what_diffusers_leaves_undone(model, scheduler, changed):
    pipe = fresh(model)
    assert type(pipe.scheduler).__name__ == scheduler
    fdh.remove_syncs(pipe)
    done = fdh.pipeline_info(pipe)["applied"]["no_sync"]
    assert done["scheduler"] == scheduler and done["changed"] is changed
    assert ("nothing to do" in done["why"]) is not changed
    assert ("set_timesteps" in vars(pipe.scheduler)) is changed  # wrapped only where it helps
    if model == "pixart":
        assert "blocking .to()" in done["why"]
    assert fdh.current_recipe(pipe)["no_sync"] is True
    result = fdh.benchmark(pipe, steps=2, runs=1, warmup=0, progress=False)
    assert f"no_sync: {done['why']}" in result.notes


def test_count_syncs_counts_from_step_zero(monkeypatch):
    """On a CPU, count_syncs runs with the CUDA calls stubbed and one fake sync warning in
    every denoiser call: the loop count must include step 0."""
    import warnings

    from fastdiff_helpers.techniques import syncs

    pipe = fresh("sd15")
    monkeypatch.setattr(syncs, "pipeline_device", lambda p: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda *a: None)
    pipe.unet.register_forward_pre_hook(
        lambda m, a: warnings.warn("called a synchronizing CUDA operation"))
    pipe.text_encoder.register_forward_pre_hook(  # before the loop: in total only
        lambda m, a: warnings.warn("called a synchronizing CUDA operation"))
    report = fdh.count_syncs(pipe, steps=3, verbose=False)
    calls = len(pipe.scheduler.timesteps)  # PNDM (PLMS) makes one more call than steps
    assert calls >= 3 and report["in_loop"] == calls and report["per_step"] == 1.0
    assert report["total"] == calls + 2  # + the prompt and negative prompt encodings
    assert "progress_bar" not in vars(pipe)  # the pipeline's own method again
