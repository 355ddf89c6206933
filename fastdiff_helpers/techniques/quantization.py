"""Dynamic int8 (and weight-only int8, fp8) quantization with torchao; 1x1 conv to linear.

Introduced in 08_int8_quantization.ipynb."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from ..models.loading import get_denoiser, pipeline_device
from ..models.noise import quiet_known_noise
from ._state import agree, applied, parts, record, refuse_after
from .flux import FLUX_PARTS, check_filter, flux_filter, is_flux
from .recipe import CONV_SWAPS, FP8, QUANT_FILTERS, QUANTIZE, Recipe, RecipeError

# The (in_features, out_features) shapes diffusion-fast leaves in bf16: the list in
# dynamic_quant_filter_fn, identical in utils/pipeline_utils.py and
# utils/pipeline_utils_pixart.py of huggingface/diffusion-fast (a published fact, carried over).
BLOG_EXCLUDED_SHAPES = frozenset({
    (1280, 640), (1920, 1280), (1920, 640), (2048, 1280), (2048, 2560), (2560, 1280),
    (256, 128), (2816, 1280), (320, 640), (512, 1536), (512, 256), (512, 512), (640, 1280),
    (640, 1920), (640, 320), (640, 5120), (640, 640), (960, 320), (960, 640),
})


def blog_filter(module, fqn: str = "") -> bool:
    """diffusion-fast's int8 filter, exactly: an nn.Linear with more than 16 input features
    whose (in_features, out_features) is not one of BLOG_EXCLUDED_SHAPES.
    Introduced in 08_int8_quantization.ipynb."""
    return (isinstance(module, torch.nn.Linear) and module.in_features > 16
            and (module.in_features, module.out_features) not in BLOG_EXCLUDED_SHAPES)


def fastdiff_filter(module, fqn: str) -> bool:
    """The course's own int8 filter (not the blog's): only big linears that see many tokens,
    since dynamic int8 pays only where the matmul amortises quantizing its activations."""
    if not isinstance(module, torch.nn.Linear):
        return False
    if module.in_features <= 16 or module.out_features <= 16:
        return False
    # Linears fed one row per image (the timestep, size and caption embeddings, and each ResNet
    # block's projection of the timestep embedding), and cross-attention K/V, which see only
    # the 77 or 120 text tokens. The one-row ones must stay out of int8 dynamic: compiled, it
    # runs torch._int_mm, which CUDA refuses for 16 rows or fewer (aten/src/ATen/native/cuda/
    # Blas.cpp, _int_mm_out_cuda); SDXL's '+ int8 dynamic' failed so on the H200
    # (results/h200/slot-2026-11-29.md) while time_emb_proj was selected.
    few_tokens = ("time_embedding", "add_embedding", "time_emb_proj", "adaln_single",
                  "caption_projection", "attn2.to_k", "attn2.to_v", "attn2.to_kv")
    if any(part in fqn for part in few_tokens):
        return False
    return module.in_features * module.out_features >= 1024 * 1024


def int8_kernel_ok(module, fqn: str = "") -> bool:
    """Whether the int8 matmul kernels take this linear (`fqn`: its name in the denoiser).
    torchao's safe_int_mm (torchao/kernel/intmm.py) runs cuBLAS int8 only when both the inner
    size (in_features) and the output size (out_features) are non-zero multiples of 8;
    otherwise it copies both operands to the CPU and multiplies there, a device-to-host sync
    on every call. And no linear fed one row per image (the timestep, size and pooled-text
    embeddings, each ResNet block's time_emb_proj, the adaLN modulations): compiled, the int8
    matmul is torch._int_mm, which CUDA refuses for 16 rows or fewer (aten/src/ATen/native/
    cuda/Blas.cpp, _int_mm_out_cuda); SDXL's '+ int8 dynamic' failed so on the H200
    (results/h200/slot-2026-11-29.md). The names are the diffusers models' own (pinned in
    tests/test_techniques.py by the rows each linear is fed)."""
    one_row = ("time_embedding", "add_embedding", "time_emb_proj", "adaln_single",
               "time_text_embed", "norm1.linear", "norm1_context.linear", "norm.linear",
               "norm_out.linear")
    return (module.in_features % 8 == 0 and module.out_features % 8 == 0
            and not any(part in fqn for part in one_row))


def fp8_kernel_ok(module) -> bool:
    """Whether torch's fp8 matmul takes this linear: torch._scaled_mm needs the inner size
    (in_features) and both sizes of the weight (in_features, out_features) to be multiples of
    16 (torch/_meta_registrations.py, _check_scaled_mm_sizes: "Expected self.size(1) to be
    divisible by 16", "Expected both dimensions of mat2 to be divisible by 16"). torchao's fp8
    config leaves any other linear in high precision without a word (quant_api.py,
    _float8_dynamic_activation_float8_weight_quantize_tensor, through utils._fp8_mm_compat);
    the course's filter says so up front. No rule on the token count.
    Introduced in 15_fp8_hopper.ipynb."""
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def blog_conv_filter(module, fqn: str = "") -> bool:
    """diffusion-fast's conv_filter_fn, exactly: a 1x1 Conv2d with 128 among its in/out
    channels (the 1x1 convs its compile step turns into linears)."""
    return (isinstance(module, torch.nn.Conv2d) and module.kernel_size == (1, 1)
            and 128 in (module.in_channels, module.out_channels))


def pointwise_conv_filter(module, fqn: str = "") -> bool:
    """The course's own swap filter: every pointwise Conv2d (1x1 kernel, stride 1, no padding,
    dilation or groups), so that quantization can reach all of them."""
    return (isinstance(module, torch.nn.Conv2d) and module.kernel_size == (1, 1)
            and module.stride == (1, 1) and module.padding in ((0, 0), "valid")
            and module.groups == 1 and module.dilation == (1, 1))


CONV_FILTERS = {"blog": blog_conv_filter, "all": pointwise_conv_filter}


def conv1x1_to_linear(pipe, which: str | bool = "blog"):
    """Swap 1x1 convolutions of the denoiser and VAE for equivalent linears with torchao's
    swap_conv2d_1x1_to_linear, so linear-only quantization reaches them. `which`: "blog"
    (diffusion-fast's conv_filter_fn) or "all" (ours: every pointwise conv). Safe twice.
    Introduced in 08_int8_quantization.ipynb."""
    from torchao.quantization import swap_conv2d_1x1_to_linear

    which = "all" if which is True else which
    if which not in CONV_SWAPS or which is False:
        raise RecipeError(f"Unknown 1x1-conv swap {which!r}: use 'blog' or 'all'.")
    refuse_after(pipe, "conv1x1_to_linear", "quantize", "compile")
    for module in parts(pipe).values():
        swap_conv2d_1x1_to_linear(module, CONV_FILTERS[which])
    swapped = sum(type(m).__name__ == "PermuteSandwich"  # torchao's wrapper of a swapped conv
                  for module in parts(pipe).values() for m in module.modules())
    record(pipe, "conv1x1_to_linear", {"filter": which, "swapped": swapped})
    return pipe


def quant_config(kind: str):
    """torchao's config for `kind`, with set_inductor_config=False: torchao would otherwise
    set inductor flags process-wide behind the recipe's back (torchao/quantization/quant_api.py
    calls recommended_inductor_config_setter() in each transform when it is True). The blog's
    flags are the recipe's inductor_flags, which compile_pipeline passes to its own compiles."""
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig,
                                      Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig, PerRow, PerTensor)

    if kind in FP8:  # the granularity said, not left to torchao's default (per tensor)
        return Float8DynamicActivationFloat8WeightConfig(
            granularity=PerRow() if kind == "fp8-dynamic-row" else PerTensor(),
            set_inductor_config=False)
    return {"int8-dynamic": Int8DynamicActivationInt8WeightConfig,
            "int8-weight-only": Int8WeightOnlyConfig}[kind](set_inductor_config=False)


def select_filter(kind: str, quant_filter: str | Callable) -> Callable:
    """The filter quantize() uses: the named or given one, and only linears the kernels take,
    whatever the filter: int8_kernel_ok for int8 dynamic, fp8_kernel_ok for fp8.
    Introduced in 08_int8_quantization.ipynb."""
    base = {"blog": blog_filter, "fastdiff": fastdiff_filter, "flux": flux_filter,
            "all": lambda m, fqn="": isinstance(m, torch.nn.Linear)}.get(quant_filter, quant_filter)
    if kind == "int8-dynamic":
        return lambda m, fqn="": base(m, fqn) and int8_kernel_ok(m, fqn)
    if kind in FP8:
        return lambda m, fqn="": base(m, fqn) and fp8_kernel_ok(m)
    return base


def quantize(pipe, kind: str = "int8-dynamic", quant_filter: str | Callable = "blog"):
    """Quantize the linears of the denoiser and VAE with torchao's quantize_.

    quant_filter: "blog" (diffusion-fast's exact filter, blog_filter), "fastdiff" (ours,
    fastdiff_filter), "all" (every nn.Linear), "flux" (Flux's transformer, flux_filter; "blog"
    is refused on Flux) or a callable (module, fqn) -> bool. For int8 dynamic and fp8, linears
    the kernels cannot take are always left out (int8_kernel_ok, fp8_kernel_ok). fp8
    ("fp8-dynamic": a scale per tensor, "fp8-dynamic-row": per row of the weight and per
    token) needs compute capability 8.9+ and is refused elsewhere before any work, as
    fdh.Recipe's policy says (15_fp8_hopper.ipynb).
    Compile afterwards: without torch.compile the quantized matmuls run unfused and are slower
    than bf16 (measured by the diffusers-torchao project on CogVideoX-5b: int8 dynamic
    550 s eager against 243 s in bf16, A100).
    Introduced in 08_int8_quantization.ipynb."""
    if kind not in QUANTIZE or kind is None:
        raise RecipeError(f"Unknown quantization {kind!r}. Use one of: "
                          f"{', '.join(k for k in QUANTIZE if k)}.")
    if not callable(quant_filter) and quant_filter not in QUANT_FILTERS:
        raise RecipeError(f"Unknown quant_filter {quant_filter!r}: use "
                          f"{', '.join(repr(f) for f in QUANT_FILTERS)} or a function "
                          "(module, fqn) -> bool.")
    if "quantize" in applied(pipe):
        raise RecipeError("This pipeline is already quantized; load a fresh pipeline.")
    refuse_after(pipe, "quantize", "compile")
    check_filter(pipe, quant_filter)
    # fp8 where torchao would stop half-way with a bare AssertionError: a device without fp8
    # tensor cores (torchao/float8/inference.py, _check_hardware_support, asserts compute
    # capability 8.9+ for the whole process, whatever the pipeline's device), and per row on
    # weights that are not bf16 (quant_api.py, "PerRow quantization only works for bfloat16
    # precision input weight")
    if kind in FP8:
        Recipe(dtype="bf16", quantize=kind).check_device(str(pipeline_device(pipe)))
    if kind == "fp8-dynamic-row":
        dtype = next(get_denoiser(pipe).parameters()).dtype
        if dtype != torch.bfloat16:
            raise RecipeError(f"quantize='fp8-dynamic-row' needs bf16 weights (torchao's per-row "
                              f"fp8 takes only bf16); this pipeline's are {dtype}: load it with "
                              "dtype='bf16', or use 'fp8-dynamic'.")
    quiet_known_noise()
    from torchao.quantization import quantize_

    fn = select_filter(kind, quant_filter)
    for module in parts(pipe).values():
        quantize_(module, quant_config(kind), filter_fn=fn)
    count = sum(type(m.weight) not in (torch.nn.Parameter, torch.Tensor)  # a torchao tensor
                for module in parts(pipe).values() for m in module.modules()
                if isinstance(m, torch.nn.Linear))
    if count == 0:
        warnings.warn(f"quant_filter={quant_filter!r} selected no linear layer: nothing was "
                      "quantized (tiny models have only small linears; try 'all').",
                      stacklevel=2)
    record(pipe, "quantize", {"kind": kind, "linears": count,
                              "filter": quant_filter if isinstance(quant_filter, str)
                              else getattr(quant_filter, "__name__", "callable")})
    return pipe


def conv_code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The 1x1-conv swap as plain code (fdh.to_code): torchao's swap with the filter's source."""
    conv_filter = CONV_FILTERS[r.conv1x1_to_linear]
    return {"conv1x1_to_linear": (
        ["# 1x1 convolutions as linears, so quantization reaches them",
         "from torchao.quantization import swap_conv2d_1x1_to_linear", conv_filter,
         f"swap_conv2d_1x1_to_linear({D}, {conv_filter.__name__})",
         f"swap_conv2d_1x1_to_linear(pipe.vae, {conv_filter.__name__})"])}


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The quantization as plain code (fdh.to_code): torchao's config and quantize_, with the
    filter's and the kernel rule's source."""
    config = type(quant_config(r.quantize)).__name__
    lines = [f"from torchao.quantization import quantize_, {config}"]
    made = f"{config}(set_inductor_config=False)"
    if r.quantize in FP8:
        granularity = "PerRow" if r.quantize == "fp8-dynamic-row" else "PerTensor"
        lines = [f"from torchao.quantization import quantize_, {config}, {granularity}"]
        made = f"{config}(granularity={granularity}(), set_inductor_config=False)"
    if r.quant_filter == "blog":
        lines.append("BLOG_EXCLUDED_SHAPES = {" + ", ".join(
            map(repr, sorted(BLOG_EXCLUDED_SHAPES))) + "}")
    if r.quant_filter == "flux":
        lines.append(f"FLUX_PARTS = {FLUX_PARTS!r}")
    named = {"blog": blog_filter, "fastdiff": fastdiff_filter, "flux": flux_filter}
    chosen = named.get(r.quant_filter)  # none for "all": every linear
    lines.append(chosen or "all_linears = lambda m, fqn: isinstance(m, torch.nn.Linear)")
    filt = chosen.__name__ if chosen else "all_linears"
    if r.quantize == "int8-dynamic":
        lines += ["# only linears the int8 kernels take", int8_kernel_ok]
        lines.append(f"int8_filter = lambda m, fqn: {filt}(m, fqn) and int8_kernel_ok(m, fqn)")
        filt = "int8_filter"
    elif r.quantize in FP8:
        lines += ["# only linears torch's fp8 matmul takes", fp8_kernel_ok]
        lines.append(f"fp8_filter = lambda m, fqn: {filt}(m, fqn) and fp8_kernel_ok(m)")
        filt = "fp8_filter"
    return {"quantize": lines + [
        "# set_inductor_config=False: torchao would set inductor flags process-wide",
        f"quantize_({D}, {made}, filter_fn={filt})",
        f"quantize_(pipe.vae, {made}, filter_fn={filt})"]}


def conv_read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """Which 1x1-conv swap each part has (fdh.current_recipe): a filter is consistent with a
    part when it would have swapped exactly the convs that now run as linears (each asked of a
    1x1 conv of its channels) and leaves none of those that remain."""
    found = {}
    for part, module in parts(pipe).items():
        swapped = [torch.nn.Conv2d(m.mod.in_features, m.mod.out_features, 1, device="meta")
                   for m in module.modules() if type(m).__name__ == "PermuteSandwich"]
        convs = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Conv2d)]
        found[part] = {False} if not swapped else set()
        found[part] |= {name for name, f in CONV_FILTERS.items()
                        if all(f(c) for c in swapped) and not any(f(m, n) for n, m in convs)}
    recorded = done.get("conv1x1_to_linear", {}).get("filter", False)
    return {"conv1x1_to_linear": agree(found, CONV_SWAPS, recorded)}


def _kind(weight) -> str | None:
    """The quantization of a linear's weight, read off torchao's tensor (None: not quantized)."""
    name = type(weight).__name__
    if name.startswith("Int8"):
        return ("int8-dynamic" if getattr(weight, "act_quant_kwargs", None) is not None
                else "int8-weight-only")
    if name.startswith("Float8"):
        scale = getattr(weight, "scale", None)
        return "fp8-dynamic-row" if scale is not None and scale.numel() > 1 else "fp8-dynamic"
    return None


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """The quantization of each part and the filter that chose its linears (fdh.current_recipe):
    a (kind, filter) is consistent with a part when the filter, with the kind's kernel rule,
    selects exactly the linears that hold torchao tensors of that kind; a filter that selects
    no linear of a part is consistent with that part unquantized. "by hand": linears no named
    filter selects (a filter of your own)."""
    flux = is_flux(pipe)  # the family's own filter, never the other's (flux.check_filter)
    filters = [f for f in QUANT_FILTERS if f != ("blog" if flux else "flux")]
    found: dict[str, set] = {}
    for part, module in parts(pipe).items():
        linears = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
        kinds = {n: _kind(m.weight) for n, m in linears}
        have = {k for k in kinds.values() if k}
        pairs = set() if have else {(None, "blog")}
        for kind in (have if have else QUANTIZE[1:]):
            chosen = {n for n, k in kinds.items() if k == kind}
            pairs |= {(kind, f) for f in filters
                      if {n for n, m in linears if select_filter(kind, f)(m, n)} == chosen}
        found[part] = pairs or {(k, "by hand") for k in have}
    record = done.get("quantize") or {}
    order = [(None, "blog")] + [(k, f) for k in QUANTIZE[1:] for f in (*filters, "by hand")]
    recorded = (record.get("kind"), record.get("filter"))
    value = agree(found, tuple(order), recorded if recorded in order else None)
    if isinstance(value, str):  # the parts disagree
        return {"quantize": value, "quant_filter": "blog"}
    if value[1] == "by hand" and record.get("filter") not in (None, *filters):
        value = (value[0], f"callable:{record['filter']}")  # your own, named by fdh.quantize
    return {"quantize": value[0], "quant_filter": value[1]}
