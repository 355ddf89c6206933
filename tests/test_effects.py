"""Each technique took effect (issue 13), observed on the running pipeline, not on a flag.

A technique that silently does nothing keeps the image the same, so the "same image" tests
of test_techniques.py cannot see it. These tests look at the effect itself: the modules and
tensors the technique must change, and hooks or spies that see them at work during a call.
Tiny models on the CPU, 2 steps; each test takes a few seconds at most."""

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.models.loading import get_denoiser
from conftest import BLOG_MODEL_KEYS


def fresh(model):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


def run(pipe, output_type="np"):
    kwargs = fdh.call_kwargs(pipe, steps=2)
    kwargs["output_type"] = output_type
    with torch.inference_mode():
        return pipe(**kwargs).images


def hook_calls(modules, during):
    """How many times each module's forward ran while `during()` ran."""
    calls = {name: 0 for name in modules}
    handles = []
    for name, module in modules.items():
        def count(mod, args, out, _name=name):
            calls[_name] += 1
        handles.append(module.register_forward_hook(count))
    try:
        during()
    finally:
        for h in handles:
            h.remove()
    return calls


def attention_modules(module):
    from diffusers.models.attention_processor import Attention
    return {n: m for n, m in module.named_modules() if isinstance(m, Attention)}


# -- fused QKV ----------------------------------------------------------------------------

@pytest.mark.parametrize("model", BLOG_MODEL_KEYS)  # diffusers' Attention; Flux: test_flux.py
@pytest.mark.parametrize("attention", ["sdpa", "sdpa-math"])
def test_fused_projections_exist_and_are_the_ones_used(model, attention):
    pipe = fdh.apply(fresh(model), fdh.Recipe(attention=attention, fuse_qkv=True))
    for owner in (get_denoiser(pipe), pipe.vae):
        attns = attention_modules(owner)
        assert attns
        fused, separate = {}, {}
        for name, attn in attns.items():
            if owner is pipe.vae and not name.startswith("decoder."):
                continue  # text-to-image never runs the VAE encoder
            cross = attn.is_cross_attention
            proj = getattr(attn, "to_kv" if cross else "to_qkv", None)
            assert isinstance(proj, torch.nn.Linear), f"{name} has no fused projection"
            width = attn.inner_dim if not cross else attn.inner_kv_dim
            assert proj.out_features == (2 if cross else 3) * width
            fused[name] = proj
            for part in ("to_k", "to_v") + (() if cross else ("to_q",)):
                if isinstance(getattr(attn, part, None), torch.nn.Module):
                    separate[f"{name}.{part}"] = getattr(attn, part)
        fused_calls = hook_calls(fused, lambda: run(pipe))
        separate_calls = hook_calls(separate, lambda: run(pipe))
        assert all(n > 0 for n in fused_calls.values()), fused_calls  # every fused one runs
        assert not any(separate_calls.values()), {k: v for k, v in separate_calls.items() if v}


# -- attention backend pinned -------------------------------------------------------------

PINNED = {"sdpa-flash": "flash", "sdpa-efficient": "efficient", "sdpa-math": "math",
          "sdpa-cudnn": "cudnn"}


def enabled_backends():
    b = torch.backends.cuda
    return frozenset(name for name, on in (("flash", b.flash_sdp_enabled()),
                                           ("efficient", b.mem_efficient_sdp_enabled()),
                                           ("math", b.math_sdp_enabled()),
                                           ("cudnn", b.cudnn_sdp_enabled())) if on)


def backends_inside_denoiser_attention(pipe, monkeypatch):
    """The SDPA backends torch allows at each scaled_dot_product_attention call that the
    denoiser makes (sdpa_kernel sets exactly these switches)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    original = F.scaled_dot_product_attention
    inside = []
    seen = []

    def spy(*args, **kwargs):
        if inside:
            seen.append(enabled_backends())
        with sdpa_kernel(SDPBackend.MATH):  # a CPU computes every pinned backend this way
            return original(*args, **kwargs)

    denoiser = get_denoiser(pipe)
    pre = denoiser.register_forward_pre_hook(lambda *a: inside.append(True))
    post = denoiser.register_forward_hook(lambda *a: inside.clear())
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    try:
        run(pipe, output_type="latent")
    finally:
        pre.remove()
        post.remove()
    return seen


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("attention", list(PINNED))
def test_pinned_backend_is_the_only_one_enabled_inside_the_denoisers_attention(
        attention, fuse, monkeypatch):
    outside = enabled_backends()
    assert len(outside) >= 2  # torch's defaults leave it a choice
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu")
    if attention in ("sdpa-flash", "sdpa-cudnn"):  # their kernels take fp16/bf16 only
        fdh.set_precision(pipe, "bf16")
    fdh.set_attention(pipe, attention)  # apply() refuses CUDA kernels on a CPU; this does not
    if fuse:
        fdh.fuse_qkv(pipe)  # diffusers installs its own fused processor: the pin must stay
    seen = backends_inside_denoiser_attention(pipe, monkeypatch)
    layers = len(attention_modules(pipe.unet))
    assert len(seen) == layers * 3  # PNDM: 2 steps make 3 denoiser calls
    assert set(seen) == {frozenset({PINNED[attention]})}
    assert enabled_backends() == outside  # restored after each call


def test_apply_pins_the_backend_of_a_fused_denoiser(monkeypatch):
    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(attention="sdpa-math", fuse_qkv=True))
    seen = backends_inside_denoiser_attention(pipe, monkeypatch)
    assert len(seen) == 3 * len(attention_modules(pipe.unet))
    assert set(seen) == {frozenset({"math"})}


def test_plain_sdpa_leaves_torch_free_to_choose(monkeypatch):
    outside = enabled_backends()
    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(attention="sdpa"))
    seen = backends_inside_denoiser_attention(pipe, monkeypatch)
    assert len(outside) >= 2 and seen and set(seen) == {outside}


@pytest.mark.parametrize("attention, kernel", [
    ("sdpa-math", "aten::_scaled_dot_product_attention_math"),
    ("sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu"),  # torch's CPU choice
])
def test_profiler_names_the_kernel_the_denoiser_runs(attention, kernel):
    from collections import Counter

    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(attention=attention))
    args, kwargs = fdh.capture_denoiser_inputs(pipe, steps=2)
    with torch.no_grad(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pipe.unet(*args, **kwargs)
    ops = Counter(e.name for e in prof.events()
                  if e.name.startswith("aten::_scaled_dot_product"))
    assert ops == {kernel: len(attention_modules(pipe.unet))}, ops


# -- channels_last ------------------------------------------------------------------------

def conv_input_layouts(pipe):
    """(channels_last inputs, other inputs) seen by the denoiser's and VAE's convolutions
    with a kernel larger than 1x1 during a call, leaving out the denoiser's first conv (fed
    the pipeline's NCHW latents) and inputs of one channel or one pixel (both layouts)."""
    layouts = {"nhwc": 0, "nchw": 0}
    handles = []

    def look(mod, args):
        x = args[0]
        if x.dim() == 4 and x.shape[1] > 1 and x.shape[2] * x.shape[3] > 1:
            nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            layouts["nhwc" if nhwc else "nchw"] += 1

    denoiser = get_denoiser(pipe)
    first = {"conv_in", "pos_embed.proj"}
    for owner in (denoiser, pipe.vae):
        for name, m in owner.named_modules():
            if (isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)
                    and not (owner is denoiser and name in first)):
                handles.append(m.register_forward_pre_hook(look))
    try:
        run(pipe)
    finally:
        for h in handles:
            h.remove()
    return layouts["nhwc"], layouts["nchw"]


@pytest.mark.parametrize("model", ["sd15", "pixart"])
def test_channels_last_weights_and_activations(model):
    pipe = fdh.apply(fresh(model), fdh.Recipe(channels_last=True))
    convs = [m for owner in (get_denoiser(pipe), pipe.vae) for m in owner.modules()
             if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    assert convs
    for conv in convs:  # 1x1 kernels are both layouts at once: left out
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert not conv.weight.is_contiguous()
    nhwc, nchw = conv_input_layouts(pipe)
    # (diffusers' Transformer2DModel hands its 1x1 proj_out an NCHW tensor: left out above)
    assert nhwc >= 10 and nchw == 0, (nhwc, nchw)
    plain_nhwc, plain_nchw = conv_input_layouts(fresh(model))
    assert plain_nhwc == 0 and plain_nchw == nhwc  # the detector sees the difference


# -- precision ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16),
                                                ("fp16", torch.float16)])
def test_reduced_precision_weights_and_activations(dtype, torch_dtype):
    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(dtype=dtype, attention="sdpa"))
    for name in ("unet", "vae", "text_encoder"):
        dtypes = {p.dtype for p in getattr(pipe, name).parameters()}
        assert dtypes == {torch_dtype}, (name, dtypes)
    seen = []
    handle = pipe.unet.register_forward_hook(lambda m, a, out: seen.append(out[0].dtype))
    try:
        latents = run(pipe, output_type="latent")
    finally:
        handle.remove()
    assert seen and set(seen) == {torch_dtype} and latents.dtype == torch_dtype


# -- compile ------------------------------------------------------------------------------

@pytest.fixture
def captured_graphs(monkeypatch):
    """torch.compile with a backend that records each graph dynamo hands it (and runs it
    eagerly, so the test stays fast), keyed by (class of the compiled object, function)."""
    import torch._dynamo

    graphs: dict[tuple[str, str], list[int]] = {}
    options: dict[tuple[str, str], list[dict]] = {}
    graphs_and_options = (graphs, options)
    real = torch.compile

    def compile(model=None, **kwargs):
        owner = getattr(model, "__self__", model)
        key = (type(owner).__name__, getattr(model, "__name__", type(model).__name__))

        def backend(gm, example_inputs):
            graphs.setdefault(key, []).append(len(gm.graph.nodes))
            return gm.forward

        options.setdefault(key, []).append(dict(kwargs))
        kwargs.pop("mode", None)
        kwargs["backend"] = backend
        return real(model, **kwargs)

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", compile)
    yield graphs_and_options
    torch._dynamo.reset()


def test_compile_runs_the_denoiser_and_vae_decode_through_dynamo(captured_graphs):
    captured_graphs, options = captured_graphs
    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(attention="sdpa", compile="default",
                                               fullgraph=True, dynamic=False))
    assert not captured_graphs  # compilation is lazy: nothing before the first call
    vae = ("AutoencoderKL", "Decoder")  # vae.decode, or the decoder module, compiled
    wanted = dict(mode="default", fullgraph=True, dynamic=False)
    assert {owner for owner, _ in options} == {"UNet2DConditionModel"} | (
        {owner for owner, _ in options} & set(vae)) and len(options) == 2, options
    for key, calls in options.items():  # the recipe's options reach torch.compile
        assert [{o: kw.get(o) for o in wanted} for kw in calls] == [wanted], key
    fdh.generate(pipe, steps=2)
    unet = captured_graphs.get(("UNet2DConditionModel", "_call_impl"), [])
    decode = [n for (owner, _), nodes in captured_graphs.items() if owner in vae for n in nodes]
    assert len(unet) == 1 and unet[0] > 200, captured_graphs  # one whole graph (fullgraph)
    assert len(decode) >= 1 and sum(decode) > 100, captured_graphs
    before = {k: list(v) for k, v in captured_graphs.items()}
    fdh.generate(pipe, steps=2)
    assert captured_graphs == before  # the second call reuses them: no recompilation


@pytest.mark.parametrize("model, scope, blocks", [
    ("sd15", "regional", {"BasicTransformerBlock"}),  # what diffusers declares for the UNet
    ("sd15", "regional-extended", {"BasicTransformerBlock", "ResnetBlock2D"}),
    ("pixart", "regional-extended", {"BasicTransformerBlock"}),
])
def test_regional_compile_runs_the_repeated_blocks_through_dynamo(model, scope, blocks,
                                                                  captured_graphs):
    captured_graphs, _ = captured_graphs
    pipe = fdh.apply(fresh(model), fdh.Recipe(attention="sdpa", compile="default",
                                              compile_scope=scope, compile_vae=False))
    fdh.generate(pipe, steps=2)
    assert set(captured_graphs) == {(b, "_call_impl") for b in blocks}, captured_graphs
    assert all(max(nodes) > 10 for nodes in captured_graphs.values()), captured_graphs


@pytest.fixture
def inductor_config():
    """torch._inductor.config, restored after the test (the flags are process-wide; pytest's
    monkeypatch would delete entries of this config module on undo)."""
    import torch._inductor.config as config

    saved = config.save_config()
    yield config
    config.load_config(saved)


@pytest.mark.parametrize("quantizing", [False, True])
def test_inductor_flags_leave_the_process_config_alone(quantizing, inductor_config):
    """The blog's flags are options of the pipeline's own compiles (torch.compile(options=)),
    never set in torch._inductor.config, where every later compile of the process would take
    them (issue 23, item 9: diffusion-fast sets them process-wide, and so did this helper)."""
    from fastdiff_helpers.techniques.compile import INDUCTOR_FLAGS, QUANT_INDUCTOR_FLAGS

    before = inductor_config.get_config_copy()
    pipe = fresh("sd15")
    if quantizing:
        fdh.set_precision(pipe, "bf16")
        fdh.quantize(pipe, "int8-dynamic", "all")
    fdh.compile_pipeline(pipe, mode="default", inductor_flags=True)
    after = inductor_config.get_config_copy()
    assert {k: (before[k], after[k]) for k in before if before[k] != after[k]} == {}
    wanted = dict(INDUCTOR_FLAGS, **(QUANT_INDUCTOR_FLAGS if quantizing else {}))
    recorded = fdh.pipeline_info(pipe).applied["inductor_flags"]
    assert recorded == {k: v for k, v in wanted.items() if hasattr(inductor_config, k)}
    assert len(recorded) >= 4 + quantizing  # this torch has every flag the course sets


def test_a_recipe_without_the_flags_compiles_without_them_after_one_with_them():
    """Two pipelines in one process, the first with the blog's flags: the second, compiled
    without them, generates plain convolutions for its 1x1 convs, and the first matmuls
    (conv_1x1_as_mm). Before issue 23 the second took the first one's flags."""
    from torch._inductor.utils import run_and_get_code

    # make test's shared compile cache: a graph loaded from it hands run_and_get_code its code
    # too (torch/_inductor/codecache.py, FxGraphCache.cache_hit_post_compile calls
    # GraphLowering.save_output_code, "used by tests to check the output"), so the second run
    # of this test, all from the cache, must count the same convolutions. Channels-last as in
    # test_techniques.py's sd15-full recipe: the flagged VAE decode generates that recipe's code,
    # so in make test its C++ kernels are already compiled (measured: 22 s a compile before,
    # 6 s after).
    flagged = fdh.compile_pipeline(fdh.set_channels_last(fresh("sd15")), mode="default",
                                   inductor_flags=True, compile_vae=True)
    plain = fdh.compile_pipeline(fdh.set_channels_last(fresh("sd15")), mode="default",
                                 compile_vae=True)
    ones = [m for m in plain.vae.modules() if isinstance(m, torch.nn.Conv2d)
            and m.kernel_size == (1, 1) and m is not plain.vae.quant_conv
            and not any(m is e for e in plain.vae.encoder.modules())]
    assert len(ones) == 2  # post_quant_conv and one conv_shortcut of the tiny decoder
    latents = torch.randn(1, 4, 8, 8)
    convolutions = {}
    for name, pipe in (("plain", plain), ("flagged", flagged)):  # the plain one first
        with torch.no_grad():
            _, code = run_and_get_code(pipe.vae.decode, latents)
        convolutions[name] = "\n".join(code).count("extern_kernels.convolution(")
    assert convolutions["flagged"] == convolutions["plain"] - len(ones), convolutions
    assert "inductor_flags" not in fdh.pipeline_info(plain).applied


# -- int8 ---------------------------------------------------------------------------------

def int8_payload(tensor) -> bool:
    """True when a torchao tensor subclass holds int8 data somewhere inside it."""
    if type(tensor) in (torch.Tensor, torch.nn.Parameter):
        return tensor.dtype == torch.int8
    if not hasattr(tensor, "__tensor_flatten__"):
        return False
    names, _ = tensor.__tensor_flatten__()
    return any(int8_payload(getattr(tensor, n)) for n in names)


def linears(pipe):
    return {f"{owner}.{n}": m for owner in ("denoiser", "vae")
            for n, m in (get_denoiser(pipe) if owner == "denoiser" else pipe.vae).named_modules()
            if isinstance(m, torch.nn.Linear)}


def test_int8_quantizes_exactly_the_linears_the_filter_selects():
    def self_attention_queries(module, fqn):
        return fqn.endswith("attn1.to_q")

    pipe = fdh.set_precision(fresh("sd15"), "bf16")
    fdh.quantize(pipe, "int8-dynamic", self_attention_queries)
    layers = linears(pipe)
    chosen = {n for n in layers if n.startswith("denoiser.") and n.endswith("attn1.to_q")}
    assert len(chosen) >= 4
    for name, layer in layers.items():
        assert int8_payload(layer.weight) == (name in chosen), name
        if name in chosen:
            assert type(layer.weight) not in (torch.Tensor, torch.nn.Parameter)
            assert layer.weight.dtype == torch.bfloat16  # bf16 outside, int8 inside
    # and the quantized matmuls are the ones that run
    calls = hook_calls({n: layers[n] for n in chosen}, lambda: run(pipe))
    assert all(calls.values()), calls


def test_int8_all_quantizes_every_linear_of_denoiser_and_vae_only():
    """Every linear but those fed one row per image (the timestep and size embeddings, each
    time_emb_proj: CUDA's compiled int8 matmul refuses them, issue 61), which stay bf16."""
    with pytest.warns(UserWarning, match="without torch.compile"):
        pipe = fdh.apply(fresh("sdxl"), fdh.Recipe(dtype="bf16", attention="sdpa",
                                                   quantize="int8-dynamic", quant_filter="all"))
    layers = linears(pipe)
    one_row = {n for n in layers if any(p in n for p in ("time_embedding", "add_embedding",
                                                         "time_emb_proj"))}
    assert len(layers) - len(one_row) > 50 and one_row
    assert all(int8_payload(m.weight) == (n not in one_row) for n, m in layers.items())
    text = [m for m in pipe.text_encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert text and not any(int8_payload(m.weight) for m in text)


# -- 1x1 convolution swap -----------------------------------------------------------------

def conv1x1(pipe):
    return {f"{owner}.{n}": m for owner in ("denoiser", "vae")
            for n, m in (get_denoiser(pipe) if owner == "denoiser" else pipe.vae).named_modules()
            if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)}


def module_at(pipe, path):
    owner, _, name = path.partition(".")
    return (get_denoiser(pipe) if owner == "denoiser" else pipe.vae).get_submodule(name)


def swapped(pipe_before_convs, pipe):
    """The 1x1 convs the swap replaced: {path: (old conv, new module)}."""
    left = conv1x1(pipe)
    return {p: (c, module_at(pipe, p)) for p, c in pipe_before_convs.items() if p not in left}


@pytest.mark.parametrize("which", [True, "all", "blog"])
def test_conv1x1_swap_replaces_the_selected_convs_with_linears_that_compute_them(which):
    import copy

    pipe = fresh("sd15")
    before = {p: copy.deepcopy(c) for p, c in conv1x1(pipe).items()}
    fdh.apply(pipe, fdh.Recipe(conv1x1_to_linear=which))
    gone = swapped(before, pipe)
    if which == "blog":  # diffusion-fast's filter: 128 among the channels
        selected = {p for p, c in before.items() if 128 in (c.in_channels, c.out_channels)}
    else:  # ours: every pointwise conv (every 1x1 conv of these models is pointwise)
        selected = set(before)
    assert selected and set(gone) == selected, sorted(set(gone) ^ selected)
    used = {}
    for path, (conv, new) in gone.items():
        linear = [m for m in new.modules() if isinstance(m, torch.nn.Linear)]
        assert len(linear) == 1, path
        assert torch.equal(linear[0].weight, conv.weight[:, :, 0, 0])
        x = torch.randn(2, conv.in_channels, 5, 3)
        with torch.no_grad():
            torch.testing.assert_close(new(x), conv(x), rtol=1e-5, atol=1e-5)
        if not path.startswith(("vae.encoder.", "vae.quant_conv")):  # never run here
            used[path] = linear[0]
    calls = hook_calls(used, lambda: run(pipe))
    assert all(calls.values()), calls  # the linears are what the pipeline now runs


# -- sync removal -------------------------------------------------------------------------

def run_on_meta(pipe):
    """The whole denoising loop on the meta device: every host read of a device tensor
    (.item(), nonzero, a CPU table indexed with a device tensor) raises there, as it would
    synchronise on a GPU. Returns (sample device, timestep device) of each denoiser call."""
    seen = []

    def spy(module, args, kwargs):  # registered last: sees what the denoiser really gets
        sample = args[0] if args else kwargs["sample"]
        t = args[1] if len(args) > 1 else kwargs["timestep"]
        seen.append((sample.device.type, t.device.type))

    pipe.to("meta")
    handle = get_denoiser(pipe).register_forward_pre_hook(spy, with_kwargs=True)
    try:
        latents = run(pipe, output_type="latent")
    finally:
        handle.remove()
    return latents, seen


def test_no_sync_runs_the_pndm_loop_without_a_host_read_and_uploads_the_timestep():
    pipe = fdh.apply(fresh("sd15"), fdh.Recipe(no_sync=True))
    latents, seen = run_on_meta(pipe)
    assert latents.device.type == "meta"
    assert seen == [("meta", "meta")] * 3  # PNDM, 2 steps: 3 denoiser calls
    assert pipe.scheduler.timesteps.device.type == "cpu"


def test_the_meta_detector_sees_the_host_read_without_no_sync():
    with pytest.raises(RuntimeError, match="meta"):
        run_on_meta(fresh("sd15"))
