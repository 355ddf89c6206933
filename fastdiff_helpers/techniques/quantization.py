"""Dynamic int8 (and weight-only int8, fp8) quantization with torchao; 1x1 conv to linear.

Introduced in 07_int8_quantization.ipynb."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from ..recipe import QUANT_FILTERS, QUANTIZE, RecipeError
from ._state import applied, modules, record, refuse_after


def blog_filter(module, fqn: str) -> bool:
    """Quantize only big linears that see many tokens (the idea of the blog's filter:
    dynamic int8 pays only where the matmul amortises quantizing its activations)."""
    if not isinstance(module, torch.nn.Linear):
        return False
    if module.in_features <= 16 or module.out_features <= 16:
        return False
    # one-token inputs (timestep, size and caption embeddings) and cross-attention K/V,
    # which see only the 77 or 120 text tokens
    few_tokens = ("time_embedding", "add_embedding", "adaln_single", "caption_projection",
                  "attn2.to_k", "attn2.to_v")
    if any(part in fqn for part in few_tokens):
        return False
    return module.in_features * module.out_features >= 1024 * 1024


class Conv1x1Linear(torch.nn.Linear):
    """A 1x1 Conv2d computed as a Linear over channels, so linear-only quantization reaches
    it (neither torch nor diffusers provides the swap)."""

    def forward(self, x):
        out = torch.nn.functional.linear(x.permute(0, 2, 3, 1), self.weight, self.bias)
        return out.permute(0, 3, 1, 2)


def swap_conv1x1(module) -> int:
    """Replace every pointwise Conv2d below `module` with Conv1x1Linear; returns the count."""
    count = 0
    for name, child in list(module.named_children()):
        pointwise = (isinstance(child, torch.nn.Conv2d) and child.kernel_size == (1, 1)
                     and child.stride == (1, 1) and child.padding in ((0, 0), "valid")
                     and child.groups == 1 and child.dilation == (1, 1))
        if pointwise:
            linear = Conv1x1Linear(child.in_channels, child.out_channels,
                                   bias=child.bias is not None, device=child.weight.device,
                                   dtype=child.weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(child.weight[:, :, 0, 0])
                if child.bias is not None:
                    linear.bias.copy_(child.bias)
            setattr(module, name, linear)
            count += 1
        else:
            count += swap_conv1x1(child)
    return count


def conv1x1_to_linear(pipe):
    """Swap the 1x1 convolutions of the denoiser and VAE for equivalent linears. Safe twice."""
    refuse_after(pipe, "conv1x1_to_linear", "quantize", "compile")
    swapped = sum(swap_conv1x1(m) for m in modules(pipe))
    record(pipe, "conv1x1_to_linear", applied(pipe).get("conv1x1_to_linear", 0) + swapped)
    return pipe


def quant_config(kind: str):
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig,
                                      Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig)

    return {"int8-dynamic": Int8DynamicActivationInt8WeightConfig,
            "int8-weight-only": Int8WeightOnlyConfig,
            "fp8-dynamic": Float8DynamicActivationFloat8WeightConfig}[kind]()


def _quantized(module) -> int:
    return sum(1 for m in module.modules() if isinstance(m, torch.nn.Linear)
               and type(m.weight) not in (torch.nn.Parameter, torch.Tensor))


def quantize(pipe, kind: str = "int8-dynamic", quant_filter: str | Callable = "blog"):
    """Quantize the linears of the denoiser and VAE with torchao's quantize_.

    quant_filter: "blog" (see blog_filter), "all" (every nn.Linear) or a callable
    (module, fqn) -> bool. Compile afterwards: without torch.compile the quantized matmuls
    run unfused and are slower than bf16 (measured by others on FLUX: 130 s against 6.6 s)."""
    if kind not in QUANTIZE or kind is None:
        raise RecipeError(f"Unknown quantization {kind!r}. Use one of: "
                          f"{', '.join(k for k in QUANTIZE if k)}.")
    if not callable(quant_filter) and quant_filter not in QUANT_FILTERS:
        raise RecipeError(f"Unknown quant_filter {quant_filter!r}: use 'blog', 'all' or a "
                          "function (module, fqn) -> bool.")
    if "quantize" in applied(pipe):
        raise RecipeError("This pipeline is already quantized; load a fresh pipeline.")
    refuse_after(pipe, "quantize", "compile")
    from torchao.quantization import quantize_

    fn = blog_filter if quant_filter == "blog" else None if quant_filter == "all" else quant_filter
    for module in modules(pipe):
        quantize_(module, quant_config(kind), filter_fn=fn)
    count = sum(_quantized(m) for m in modules(pipe))
    if count == 0:
        warnings.warn(f"quant_filter={quant_filter!r} selected no linear layer: nothing was "
                      "quantized (tiny models have only small linears; try 'all').",
                      stacklevel=2)
    record(pipe, "quantize", {"kind": kind, "linears": count})
    return pipe
