"""GPU readiness (issue 11), part 2: fused QKV weights, peak memory kinds, weights="auto"
against the cache, and no_sync per scheduler, each pinned on the CPU."""

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh


def fresh(model):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


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
        exec(fdh.to_code(recipe, "plain"), namespace)
        pipe = namespace["pipe"]
    unfused = fdh.count_parameters(fresh(model))
    assert fdh.count_parameters(pipe) == unfused
    assert np.abs(image(pipe) - reference).max() <= 1e-4


# -- peak memory: allocated vs reserved (CUDA-graph pools show only in reserved) -----------

def _memory_result(**kw):
    from fastdiff_helpers.results.store import Result

    fields = dict(model="sdxl", weights="random", step="+ compile", recipe={}, device_name="H100",
                  height=1024, width=1024, steps=30, latency_s=2.5, latency_samples=[2.5] * 3,
                  peak_memory_bytes=9 * 2**30, peak_memory_kind="cuda_max_allocated",
                  peak_reserved_bytes=12 * 2**30)
    fields.update(kw)
    return Result(**fields)


def test_reserved_memory_round_trips_and_old_records_load(tmp_path):
    import json

    from fastdiff_helpers.results.store import load_results, save_results

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
    monkeypatch.setenv("FASTDIFF_WEIGHTS_FILE", str(tmp_path / "weights.json"))  # none carried
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))  # read once at import
    return tmp_path


def test_auto_falls_back_when_only_model_index_is_cached(hf_cache):
    from fastdiff_helpers.models.pretrained import choose_weights

    _fake_cache(hf_cache, ["unet/config.json", "text_encoder/model.fp16.safetensors",
                           "vae/diffusion_pytorch_model.safetensors"])
    weights, why = choose_weights(fdh.MODELS["sdxl"], None, "cpu")
    assert weights == "tiny"
    # fp16 files count (a half-precision load takes them: models/downloads.py)
    assert "only partly cached" in why and "for unet, text_encoder_2)" in why
    # on a GPU "auto" stops rather than pick random weights unasked (test_weights_choice.py)
    assert choose_weights(fdh.MODELS["sdxl"], None, "cuda")[0] == "none"


def test_auto_picks_pretrained_when_every_component_is_cached(hf_cache):
    from fastdiff_helpers.models.pretrained import choose_weights

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
    done = fdh.pipeline_info(pipe).applied["no_sync"]
    assert done["scheduler"] == scheduler and done["changed"] is changed
    assert ("nothing to do" in done["why"]) is not changed
    assert ("set_timesteps" in vars(pipe.scheduler)) is changed  # wrapped only where it helps
    if model == "pixart":
        assert "blocking .to()" in done["why"]
    assert fdh.current_recipe(pipe)["no_sync"] is True
    result = fdh.benchmark(pipe, steps=2, runs=1, warmup=0, progress=False)
    assert f"no_sync: {done['why']}" in result.notes


@pytest.mark.parametrize("model", ["sd15", "pixart"])
def test_count_syncs_counts_from_step_zero(model, monkeypatch):
    """On a CPU, count_syncs runs with the CUDA calls stubbed and one fake sync warning in
    every denoiser call: the loop count must include step 0. PixArt's pipeline takes no
    callback_on_step_end (its **kwargs swallowed it): no step was marked, and every sync
    counted as outside the loop (in_loop 0, whatever the loop did)."""
    import warnings

    from fastdiff_helpers.techniques import syncs

    pipe = fresh(model)
    monkeypatch.setattr(syncs, "pipeline_device", lambda p: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda *a: None)
    fdh.get_denoiser(pipe).register_forward_pre_hook(
        lambda m, a: warnings.warn("called a synchronizing CUDA operation"))
    encodes = []
    pipe.text_encoder.register_forward_pre_hook(  # before the loop: in total only
        lambda m, a: encodes.append(1) or warnings.warn("called a synchronizing CUDA operation"))
    report = fdh.count_syncs(pipe, steps=3, verbose=False)
    calls = len(pipe.scheduler.timesteps)  # PNDM (PLMS) makes one more call than steps
    assert calls >= 3 and report["in_loop"] == calls and report["per_step"] == 1.0
    assert encodes and report["total"] == calls + len(encodes)  # + the prompt encodings
    assert "progress_bar" not in vars(pipe)  # the pipeline's own method again


@pytest.mark.parametrize("model, lookups", [("sd15", 1), ("sdxl", 0)])
def test_a_counting_scheduler_looks_its_index_up_at_most_once_an_image(model, lookups):
    """DPM-Solver (the blog's SD1.5 scheduler) and Euler count their step index: the GPU lookup
    `(timesteps == t).nonzero()` (index_for_timestep) runs only at the first step, and only
    where the pipeline sets no begin index (SD1.5's does not, SDXL's does). So the per-step
    lookup is in neither source's stack: diffusers 0.25 already counted (PR 4347)."""
    from diffusers import DPMSolverMultistepScheduler

    pipe = fresh(model)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    calls = []
    original = pipe.scheduler.index_for_timestep
    pipe.scheduler.index_for_timestep = lambda *a, **k: calls.append(a) or original(*a, **k)
    fdh.generate(pipe, steps=4)
    assert len(calls) == lookups
