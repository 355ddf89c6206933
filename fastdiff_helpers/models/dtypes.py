"""The package's one dtype vocabulary, which every other module asks: names, torch dtypes,
bytes, fp32 or half, the dtype a load on a device uses; and the compute capability bf16, flash
attention and fp8 matmuls need (the recipe's refusals and the course's GPU profiles read them).
"""

from __future__ import annotations

import torch

from ..errors import FastdiffError

# What a card's compute capability lets run, each with the line that decides it on a real card:
# - bf16 graphs: inductor skips (SkipFrame "BF16 is not supported", honoured under fullgraph) a
#   graph with bf16 inputs or outputs unless torch.cuda.is_bf16_supported(including_emulation=
#   False) (torch/_inductor/compile_fx.py _check_triton_bf16_support), which asks
#   get_device_properties(device).major >= 8 (torch/cuda/__init__.py is_bf16_supported).
BF16_FROM = (8, 0)
# - flash attention: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
#   check_flash_attention_hardware_support, check_sm_version<sm80, sm121>; memory-efficient
#   attention check_sm_version<sm50, sm121> (C++, not in the wheel: read in pytorch's source)
FLASH_FROM = (8, 0)
# - fp8 matmuls: torchao's float8 kernels need sm89 (torchao/utils.py is_sm_at_least_89), as does
#   torch._scaled_mm; the course's refusal (techniques/recipe.py Recipe.check_device) says so
FP8_FROM = (8, 9)

# the weight dtypes a pipeline loads in, and a Recipe's dtype names (techniques/recipe.py)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
RECIPE_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def weight_name(dtype: str) -> str:  # a Recipe's "tf32" is fp32 weights with TF32 math
    return "fp32" if dtype == "tf32" else dtype


def weight_dtype(dtype: str) -> torch.dtype:  # the weights' torch dtype of a Recipe's dtype name
    return DTYPES[weight_name(dtype)]


def element_bytes(dtype: str) -> int:  # bytes per element of a name's weights (dtype.itemsize)
    return weight_dtype(dtype).itemsize


def fp32_or_half(dtype: str | torch.dtype) -> str:
    """"fp32" for fp32 weights (a name, "tf32" included, torch.float32 or its str), else "half"."""
    return "fp32" if dtype in ("fp32", "tf32", torch.float32, "torch.float32") else "half"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise FastdiffError(f"Unknown dtype {dtype!r} for loading. Use one of "
                        f"{', '.join(DTYPES)} (TF32 is a matmul setting, not a weight dtype: "
                        "load in fp32 and use fdh.set_precision(pipe, 'tf32')).")


def load_dtype(dtype: torch.dtype, device: str, capability: tuple[int, int] | None = None,
               verbose: bool = False) -> torch.dtype:
    """The dtype a load on `device` uses: bf16 as fp16 below compute capability 8.0 (a T4),
    as fdh.apply runs a bf16 recipe there (Recipe.for_device); loaded in bf16 and cast to fp16
    by apply, the weights would lose three bits of fp16's mantissa on the way. `capability`:
    read from the GPU when not given."""
    if dtype is not torch.bfloat16 or not str(device).startswith("cuda"):
        return dtype
    capability = tuple(capability or torch.cuda.get_device_capability(device))
    if capability >= BF16_FROM:
        return dtype
    if verbose:
        print(f"fastdiff: loading in fp16, not bf16: compute capability {capability} "
              "has no bf16 tensor cores, and fdh.apply runs a bf16 recipe here as fp16")
    return torch.float16
