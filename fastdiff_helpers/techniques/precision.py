"""Precision: fp32 (true fp32, TF32 off), TF32, bf16, fp16. Introduced in 02_precision.ipynb."""

from __future__ import annotations

from typing import Any

import torch

from ..models.build import quiet_diffusers
from ._state import agree, record, refuse_after
from ..models.dtypes import DTYPE_NAMES, fp32_or_half, weight_dtype
from .recipe import DTYPES, TF32_MODES, RecipeError


# Each TF32 mode as the settings set_tf32 makes: the CUDA-wide fp32 precision ("none": torch's
# default), the legacy cuDNN switch (conv and rnn), and the matmul switch, through
# set_float32_matmul_precision, or, for "guide", the legacy matmul flag the guide shows.
TF32_SETTINGS = {
    "off": ("ieee", False, "highest"),  # true fp32 everywhere, the course's baseline
    "on": ("tf32", True, "high"),  # TF32 for every fp32 matmul and convolution, eager and compiled
    "blog": ("none", True, "high"),  # diffusion-fast's run_benchmark.py; cuDNN: torch's default
    "guide": ("none", True, "allow_tf32"),  # the diffusers guide's; cuDNN: torch's default
}


def set_tf32(mode: str | bool) -> None:
    """Set TF32 for fp32 matmuls and convolutions, process-wide: `mode` is one of TF32_SETTINGS
    (True: "on", False: "off").

    torch 2.13 keeps TF32 state at three levels: the CUDA-wide `torch.backends.cudnn.
    fp32_precision` (what inductor's conv templates read, torch/_inductor/kernel/conv.py), the
    per-op conv/rnn/matmul values, and the legacy allow_tf32 booleans, whose getters raise once
    they disagree with the rest (aten Context::allowTF32CuDNN). Each mode sets all three, so the
    legacy flags stay readable and true whatever mode ran before (tests/test_blog_fidelity.py).
    What fdh.Recipe(dtype="tf32") runs; 02_precision.ipynb sets TF32 by hand."""
    if mode is True or mode is False:
        mode = "on" if mode else "off"
    if mode not in TF32_MODES:
        raise RecipeError(f"Unknown TF32 mode {mode!r}. Use one of: {', '.join(TF32_MODES)}.")
    cuda_wide, cudnn, matmul = TF32_SETTINGS[mode]
    torch.backends.cudnn.fp32_precision = cuda_wide
    torch.backends.cudnn.allow_tf32 = cudnn
    if matmul == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision(matmul)


def tf32_state() -> dict[str, Any]:
    """TF32 as torch will use it now: per-op values, the CUDA-wide level inductor reads, the
    float32 matmul precision and the legacy flags ("unreadable" where torch refuses to say)."""
    backends = torch.backends
    state: dict[str, Any] = {"matmul": backends.cuda.matmul.fp32_precision,
                             "cudnn_conv": backends.cudnn.conv.fp32_precision,
                             "cuda_wide": backends.cudnn.fp32_precision}
    for name, read in (("float32_matmul_precision", torch.get_float32_matmul_precision),
                       ("legacy_matmul_allow_tf32", lambda: backends.cuda.matmul.allow_tf32),
                       ("legacy_cudnn_allow_tf32", lambda: backends.cudnn.allow_tf32)):
        try:
            state[name] = read()
        except RuntimeError:  # torch refuses when the legacy and new APIs were mixed
            state[name] = "unreadable"
    return state


def set_precision(pipe, dtype: str = "bf16", tf32: str | None = None):
    """Cast every component to `dtype` and set TF32 (see set_tf32; by default on only for
    dtype "tf32", so "fp32" is true fp32). The TF32 switch is process-wide."""
    if dtype not in DTYPES:
        raise RecipeError(f"Unknown dtype {dtype!r}. Use one of: {', '.join(DTYPES)}.")
    mode = tf32 or ("on" if dtype == "tf32" else "off")
    if dtype == "tf32" and mode == "off":
        raise RecipeError("dtype='tf32' with tf32='off' contradicts itself: use dtype='fp32'.")
    refuse_after(pipe, "set_precision", "quantize", "compile")
    with quiet_diffusers():
        pipe.to(dtype=weight_dtype(dtype))
    set_tf32(mode)
    record(pipe, "dtype", dtype)
    record(pipe, "tf32", mode)
    return pipe


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The recipe's precision as plain code (fdh.to_code): the technique alone, so a stock
    pipeline's fp32 weights and TF32 off are not written; a TF32 mode the recipe names is, "off"
    included, as the statements set_tf32 runs, without those that set what a fresh process
    already has (torch's defaults for cuDNN: no CUDA-wide precision, TF32 convolutions allowed),
    so the blog's mode is its one line, as diffusion-fast wrote it."""
    tf32 = r.tf32 or ("on" if r.dtype == "tf32" else None)
    lines = [] if fp32_or_half(r.dtype) == "fp32" else [f"pipe.to({weight_dtype(r.dtype)})"]
    if tf32 is not None:
        cuda_wide, cudnn, matmul = TF32_SETTINGS[tf32]
        lines.append(f"# TF32 {tf32!r}: a process-wide switch")
        if (cuda_wide, cudnn) != ("none", True):
            lines += [f"torch.backends.cudnn.fp32_precision = {cuda_wide!r}",
                      f"torch.backends.cudnn.allow_tf32 = {cudnn}"]
        lines.append("torch.backends.cuda.matmul.allow_tf32 = True" if matmul == "allow_tf32"
                     else f"torch.set_float32_matmul_precision({matmul!r})")
    return {"precision": lines} if lines else {}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """dtype and tf32 as the pipeline runs them (fdh.current_recipe): the weights of every
    component (a cast, pipe.to(dtype), changes them all), and the TF32 mode set_precision
    recorded (`done`: the helpers' records), else the mode whose settings torch has now ("blog"
    and "guide" leave the same ones), else what its matmul switch says."""
    found = {name: {DTYPE_NAMES.get(next(m.parameters()).dtype, "fp32")}
             for name, m in pipe.components.items()
             if isinstance(m, torch.nn.Module) and next(m.parameters(), None) is not None}
    dtype = agree(found, ("fp32", "bf16", "fp16"))
    state = tf32_state()
    modes = [mode for mode, (cuda_wide, cudnn, matmul) in TF32_SETTINGS.items()
             if (cuda_wide, cudnn) == (state["cuda_wide"], state["legacy_cudnn_allow_tf32"])
             and (state["legacy_matmul_allow_tf32"] is True if matmul == "allow_tf32" else
                  state["float32_matmul_precision"] == matmul)]  # "blog" and "guide": one state
    tf32 = done.get("tf32") or (modes[0] if modes else "on" if state["matmul"] == "tf32"
                                else "off")
    if dtype == "fp32" and tf32 == "on":
        dtype = "tf32"
    return {"dtype": dtype, "tf32": None if tf32 == ("on" if dtype == "tf32" else "off")
            else tf32}  # None: implied by the dtype
