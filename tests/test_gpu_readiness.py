"""GPU readiness (issue 11): what the first GPU run would hit, each decision pinned on the CPU.

This part: graph_breaks and dynamo's caches, regional compile and CUDA graphs, forced SDPA
backends and their kernels' limits. Part 2 is tests/test_readiness_models.py."""

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.techniques.recipe import RecipeError


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
    recipe.check_device("cuda:0")  # so does the original: adapted (by apply), not refused
    full = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode)
    assert full.for_device("cuda:0") == (full, [])  # whole-denoiser graphs are fine
    assert recipe.for_device("cpu")[0].compile == runs  # CPU: no graphs at all


def test_compile_pipeline_drops_regional_cuda_graphs_on_cuda(monkeypatch, capsys):
    """The one policy, for the technique called alone: the regional compile runs without the
    per-block graphs, said (nothing compiles until a call, so this runs on a CPU)."""
    from fastdiff_helpers.techniques import compile as comp

    pipe = fresh("sd15")
    monkeypatch.setattr(comp, "pipeline_device", lambda p: torch.device("cuda", 0))
    fdh.compile_pipeline(pipe, mode="max-autotune", scope="regional")
    assert fdh.pipeline_info(pipe).applied["compile"]["mode"] == "max-autotune-no-cudagraphs"
    assert "152887" in capsys.readouterr().out


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
    assert sum(fdh.pipeline_info(pipe).attention_pinned.values()) == pinned
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
    assert "attention" not in fdh.pipeline_info(pipe).applied
    fdh.Recipe(dtype="fp32", attention="sdpa-efficient")  # fp32 is fine there


def test_apply_refuses_flash_on_pixart_before_any_work(monkeypatch):
    pipe = fresh("pixart")
    monkeypatch.setattr(fdh.Recipe, "check_device", lambda self, device: None)  # as on a GPU
    with pytest.raises(RecipeError, match="refuses an attention mask"):
        fdh.apply(pipe, fdh.Recipe(dtype="bf16", attention="sdpa-flash"))
    assert pipe.transformer.dtype == torch.float32 and not fdh.pipeline_info(pipe).applied


def _sdpa_callers(pipe, kwargs, monkeypatch):
    """Which library made each scaled_dot_product_attention call of pipe(**kwargs)."""
    import traceback
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kw):
        caller = traceback.extract_stack(limit=2)[0].filename
        calls.append("transformers" if "transformers" in caller else
                     "diffusers" if "diffusers" in caller else caller)
        return real(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.inference_mode():
        pipe(**kwargs)
    return calls


def test_denoiser_only_call_runs_no_text_encoder_attention(monkeypatch):
    # On an H100 the pinned-flash GPU test saw other SDPA kernels: they were the CLIP text
    # encoder's (transformers), which set_attention never pins. The GPU test now encodes the
    # prompts first (conftest.denoiser_only_kwargs); here: that leaves only the UNet's calls.
    from diffusers.models.attention_processor import Attention
    from conftest import denoiser_only_kwargs

    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(attention="sdpa"))
    layers = sum(isinstance(m, Attention) for m in pipe.unet.modules())
    whole = fdh.call_kwargs(pipe, steps=2)
    whole["output_type"] = "latent"
    seen = _sdpa_callers(pipe, whole, monkeypatch)
    encoder_layers = pipe.text_encoder.config.num_hidden_layers
    # prompt and negative prompt are encoded apart, one SDPA per encoder layer each
    assert seen.count("transformers") == 2 * encoder_layers
    calls = len(pipe.scheduler.timesteps)  # PNDM: 3 UNet calls (CFG batched) for 2 steps
    assert seen.count("diffusers") == layers * calls
    only = _sdpa_callers(pipe, denoiser_only_kwargs(pipe, steps=2), monkeypatch)
    assert only == ["diffusers"] * (layers * calls)
