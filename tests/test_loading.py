"""Foundation: the four models from three weight sources (issue 2)."""

import os
import warnings

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning.gpus import PROFILES as GPU_PROFILES
from fastdiff_helpers.models.build import build_component
from conftest import MODEL_KEYS


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_full_size_parameter_counts_equal_published(model):
    pipe = fdh.load_pipeline(model, weights="random", device="meta")
    counts = fdh.count_parameters(pipe)
    for component, published in fdh.course.PUBLISHED_PARAMETERS[model].items():
        assert counts[component] == published, component
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    # meta: nothing allocated
    assert all(p.is_meta for p in getattr(pipe, fdh.MODELS[model].denoiser).parameters())


def test_ssd1b_unet_is_about_1_3_billion():
    counts = fdh.count_parameters(fdh.load_pipeline("ssd1b", weights="random", device="meta"))
    assert 1.25e9 < counts["unet"] < 1.35e9
    assert counts["unet"] == 1_331_334_404  # the figure the README quotes
    sdxl = fdh.count_parameters(fdh.load_pipeline("sdxl", weights="random", device="meta"))
    assert counts["unet"] < 0.55 * sdxl["unet"]


def test_random_init_is_seeded_materialised_and_keeps_buffers():
    comp = fdh.MODELS["sdxl"].tiny["text_encoder"]
    a = build_component(comp, "cpu", torch.float32, seed=3)
    b = build_component(comp, "cpu", torch.float32, seed=3)
    c = build_component(comp, "cpu", torch.float32, seed=4)
    wa = dict(a.named_parameters())
    wb, wc = dict(b.named_parameters()), dict(c.named_parameters())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)
    assert not any(p.is_meta for p in a.parameters())
    # buffers built in the constructor survive materialisation
    pos = a.get_buffer("embeddings.position_ids")
    assert torch.equal(pos[0], torch.arange(77))
    assert not a.training


def test_random_bf16_dtype_and_tied_t5_embeddings():
    t5 = build_component(fdh.MODELS["pixart"].tiny["text_encoder"], "cpu", torch.bfloat16)
    assert t5.shared.weight is t5.encoder.embed_tokens.weight
    assert {p.dtype for p in t5.parameters()} == {torch.bfloat16}
    assert torch.isfinite(t5.shared.weight.float()).all()


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_tiny_generation_is_deterministic_per_seed(model, tiny_pipes):
    pipe = tiny_pipes[model]
    a = np.asarray(fdh.generate(pipe, steps=2, seed=0))
    b = np.asarray(fdh.generate(pipe, steps=2, seed=0))
    c = np.asarray(fdh.generate(pipe, steps=2, seed=1))
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, b)
    # another seed is another image: measured max differences 194-255 of 255
    assert np.abs(a.astype(int) - c.astype(int)).max() > 100


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_every_component_is_in_eval_mode(model, tiny_pipes):
    for name, comp in tiny_pipes[model].components.items():
        if isinstance(comp, torch.nn.Module):
            assert not any(m.training for m in comp.modules()), name


@pytest.mark.parametrize("model", ["sdxl", "pixart"])
def test_saved_tiny_pipeline_loads_back_through_pretrained_path(model, tmp_path, tiny_pipes):
    pipe = tiny_pipes[model]
    pipe.save_pretrained(tmp_path)
    files = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs]
    assert any(f.endswith(".safetensors") for f in files)
    assert not any(f.endswith(".bin") for f in files)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = fdh.load_pipeline(model, weights="pretrained", path=str(tmp_path), device="cpu")
    # diffusers 0.42 deprecates from_pretrained's torch_dtype= for dtype= (a FutureWarning on
    # every pretrained load: diffusers/utils/deprecation_utils.py, _resolve_dtype)
    assert not [w for w in caught if "torch_dtype" in str(w.message)]
    assert fdh.pipeline_info(again).weights == "pretrained"
    # call_kwargs of a pretrained pipeline default to the native size: pass the tiny one
    a = np.asarray(fdh.generate(pipe, steps=2, height=64, width=64))
    b = np.asarray(fdh.generate(again, steps=2, height=64, width=64))
    assert np.array_equal(a, b)


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError, match="Known models: flux, flux-schnell, pixart, sd15, sdxl, ssd1b"):
        fdh.load_pipeline("sd3", weights="tiny")


def test_unknown_weights_and_dtype():
    with pytest.raises(fdh.FastdiffError, match="Unknown weights 'huge'"):
        fdh.load_pipeline("sdxl", weights="huge")
    with pytest.raises(fdh.FastdiffError, match="Unknown dtype 'fp8'.*fp32, bf16, fp16"):
        fdh.load_pipeline("sdxl", weights="tiny", dtype="fp8")


def test_pretrained_offline_and_not_cached_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(fdh.FastdiffError) as err:
        fdh.load_pipeline("sdxl", weights="pretrained", device="cpu")
    msg = str(err.value)
    assert "hf download stabilityai/stable-diffusion-xl-base-1.0" in msg
    assert "weights='random'" in msg and "weights='tiny'" in msg
    # one clear error: no chained traceback behind it
    assert err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__


def test_local_path_that_is_not_a_pipeline_folder(tmp_path):
    (tmp_path / "readme.txt").write_text("not a pipeline")
    with pytest.raises(fdh.FastdiffError, match="not a pipeline folder"):
        fdh.load_pipeline("sd15", weights="pretrained", path=str(tmp_path))


def test_auto_on_cpu_without_weights_chooses_tiny_and_says_why(capsys, tmp_path, monkeypatch):
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    pipe = fdh.load_pipeline("sd15", weights="auto", device="cpu")
    out = capsys.readouterr().out
    assert fdh.pipeline_info(pipe).weights == "tiny"
    assert "weights='tiny'" in out and "no GPU" in out


def test_meta_device_needs_random_weights():
    with pytest.raises(fdh.FastdiffError, match="weights='random'"):
        fdh.load_pipeline("sdxl", weights="tiny", device="meta")


def test_a_run_carries_the_spec_it_resolved():
    """Issue 25, item 3: the spec a run resolved travels with the pipeline; the helpers that get
    the pipeline (call_kwargs, count_flops, benchmark through measure_step) read that one instead
    of looking the key up again. A spec that differs from the registry's (3 steps, guidance 1)
    shows which one they read: before, each looked "sd15" up and used 50 steps and guidance 7.5."""
    import dataclasses

    from fastdiff_helpers.models.loading import call_kwargs, pipeline_spec
    from fastdiff_helpers.course.runs.ladder import measure_step

    spec = dataclasses.replace(fdh.MODELS["sd15"], steps=3, guidance=1.0)
    pipe = fdh.load_pipeline(spec, weights="tiny", device="cpu", verbose=False)
    assert pipeline_spec(pipe) is spec
    kwargs = call_kwargs(pipe)
    assert (kwargs["num_inference_steps"], kwargs["guidance_scale"]) == (3, 1.0)
    flops = fdh.count_flops(pipe)
    assert (flops["steps"], flops["batch"]) == (3, 1)
    assert flops["calls"] == 4  # SD1.5's PNDM: steps + 1 UNet calls (scheduling_pndm.py:213)
    assert flops["per_image"] == (4 * flops["denoiser_per_forward"] + flops["vae_decode"]
                                  + flops["text_encoders"])
    result = measure_step(spec, "fp32", fdh.Recipe(), "tiny", "cpu", {}, runs=1, warmup=0,
                          progress=False)
    assert result.error is None, result.error
    assert (result.steps, result.guidance, result.model) == (3, 1.0, "sd15")


def test_pipelines_loaded_another_way_get_their_spec_from_the_class():
    from fastdiff_helpers.models.loading import pipeline_spec

    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    del pipe._fastdiff  # as if diffusers' from_pretrained had made it
    assert pipeline_spec(pipe) is fdh.MODELS["sd15"]


def test_the_record_on_a_pipeline_is_typed():
    """Issue 58: what the helpers keep on a pipeline is one typed object (models/state.py
    PipelineState), its spec inside it, not a dict beside a second hidden attribute; what
    00_setup's cell shows of it is one line. Before, fdh.pipeline_info returned a dict."""
    import ast
    from pathlib import Path

    from fastdiff_helpers.models.state import PipelineState

    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    info = fdh.pipeline_info(pipe)
    assert isinstance(info, PipelineState) and info.spec is fdh.MODELS["sd15"]
    assert (info.model, info.weights, info.dtype, info.device, info.vae, info.applied) == (
        "sd15", "tiny", "torch.float32", "cpu", "pipeline", {})
    assert not hasattr(pipe, "_fastdiff_spec")
    fdh.set_attention(pipe, "sdpa")
    shown = repr(info)
    assert shown == ("PipelineState(model='sd15', weights='tiny', dtype='torch.float32', "
                     "device='cpu', vae='pipeline', applied={'attention': 'sdpa'})"), shown
    # no module of the package reads the record as a dict (pipeline_info(pipe)["applied"])
    package = Path(fdh.__file__).parent
    indexed = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "pipeline_info"):
                indexed.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not indexed, indexed


@pytest.mark.parametrize("vae", [None, "fp16-fix"])
def test_tiny_weights_in_half_are_the_fp32_weights_rounded(vae):
    """Every rung loads in its own dtype, and quality is measured against the fp32 rung: tiny
    weights (the pipeline's and a swapped VAE's) are the fp32 ones, cast. Drawn in bf16 they
    were other weights, and the blog ladder's bf16 PSNR on tiny SDXL fell from 46 to 23 dB."""
    import logging

    said: list[str] = []
    catch = logging.Handler()
    catch.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("diffusers").addHandler(catch)
    try:
        fp32 = fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False, vae=vae)
        half = fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False, vae=vae,
                                 dtype="bf16")
    finally:
        logging.getLogger("diffusers").removeHandler(catch)
    # diffusers' cast warning ("should be kept in float32: []", ModelMixin.to) is not ours to
    # print: no module of these is pinned to fp32, and a participant can do nothing about it
    assert not [m for m in said if "should be kept in float32" in m], said
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        ours = dict(getattr(half, name).named_parameters())
        for key, p in getattr(fp32, name).named_parameters():
            assert ours[key].dtype == torch.bfloat16
            assert torch.equal(ours[key], p.to(torch.bfloat16)), (vae, name, key)


def test_a_tiny_load_in_half_says_nothing_about_fp32_pinned_modules(capfd):
    """The cast of tiny weights to bf16 (09's and 07's load before their technique cell) goes
    through diffusers' .to(dtype), which warns about modules to keep in fp32 (there are none):
    the load keeps that warning out of the notebook."""
    fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False, dtype="bf16")
    out, err = capfd.readouterr()
    assert "should be kept in float32" not in out + err


@pytest.mark.parametrize("card", sorted(GPU_PROFILES))
def test_a_bf16_load_on_a_card_is_the_dtype_apply_runs(card, monkeypatch):
    """One policy: below sm80 fdh.apply runs a bf16 recipe as fp16 (Recipe.for_device), and
    load_pipeline loads it in fp16 (loaded in bf16 and cast, the weights would be rounded to
    bf16's 8 mantissa bits first). The capability read from the GPU when not given."""
    from fastdiff_helpers.models.dtypes import load_dtype

    profile = fdh.course.gpu_profile(card)
    recipe = fdh.Recipe(dtype="bf16").for_device("cuda", profile.capability)[0]
    loaded = load_dtype(torch.bfloat16, "cuda", profile.capability)
    assert loaded == {"bf16": torch.bfloat16, "fp16": torch.float16}[recipe.weight_dtype]
    assert loaded == (torch.float16 if card == "t4" else torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: profile.capability)
    assert load_dtype(torch.bfloat16, "cuda:0") == loaded
    assert load_dtype(torch.bfloat16, "cpu", profile.capability) == torch.bfloat16
    assert load_dtype(torch.float32, "cuda", profile.capability) == torch.float32
