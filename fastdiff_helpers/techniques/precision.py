"""Precision: fp32 (true fp32, TF32 off), TF32, bf16, fp16. Introduced in 02_precision.ipynb."""

from __future__ import annotations

import torch

from ..recipe import DTYPES, RecipeError
from ._state import quiet_diffusers, record, refuse_after

WEIGHT_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                 "fp16": torch.float16}


def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and convolutions: a process-wide switch, not a weight dtype."""
    value = "tf32" if enabled else "ieee"
    torch.backends.cuda.matmul.fp32_precision = value
    torch.backends.cudnn.conv.fp32_precision = value


def set_precision(pipe, dtype: str = "bf16"):
    """Cast every component to `dtype` and set TF32 (on only for "tf32").

    "fp32" is true fp32: torch 2.13 runs cuDNN convolutions in TF32 by default, so the
    baseline switches it off explicitly. The TF32 switch is process-wide."""
    if dtype not in DTYPES:
        raise RecipeError(f"Unknown dtype {dtype!r}. Use one of: {', '.join(DTYPES)}.")
    refuse_after(pipe, "set_precision", "quantize", "compile")
    with quiet_diffusers():
        pipe.to(dtype=WEIGHT_DTYPES[dtype])
    set_tf32(dtype == "tf32")
    record(pipe, "dtype", dtype)
    return pipe
