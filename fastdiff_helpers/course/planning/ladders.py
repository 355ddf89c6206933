"""The ladders: LADDER, the blog's recipe on today's stack (its steps, filters, flags, TF32, VAE
and scheduler as diffusion-fast set them; what differs, the stack, torchao's API, fused QKV's
dropped copies, per-compile flags and the timing, is listed in 01_baseline.ipynb);
COURSE_LADDER, the course's own ladder beside it; FLUX_LADDER, the course's Flux ladder.

Introduced in 01_baseline.ipynb. Imports nothing of the package but the recipe.
"""

from __future__ import annotations

from dataclasses import replace

from ...techniques.recipe import BASELINE, Recipe


# The blog's ladder, its recipe as diffusion-fast set it (utils/pipeline_utils.py,
# run_benchmark.py and experiment-scripts/run_sd.sh in huggingface/diffusion-fast), on today's
# stack (what differs: 01_baseline.ipynb): every step under
# torch.set_float32_matmul_precision("high"); its compile step (--compile_unet --compile_vae
# --compile_mode=max-autotune --change_comp_config) sets channels_last, swaps the 1x1 convs with
# its conv_filter_fn, sets its four inductor flags and compiles with fullgraph=True; its int8 step
# quantizes with its dynamic_quant_filter_fn. The blog's VAE and scheduler are loading choices
# (published.BLOG_LOADING), applied by run_ladder(ladder="blog").
_B_FP32 = Recipe(tf32="blog")
_B_BF16 = replace(_B_FP32, dtype="bf16")
_B_SDPA = replace(_B_BF16, attention="sdpa")
_B_COMPILED = replace(_B_SDPA, compile="max-autotune", fullgraph=True, inductor_flags=True,
                      channels_last=True, compile_vae=True, conv1x1_to_linear="blog")
_B_FUSED = replace(_B_COMPILED, fuse_qkv=True)
_B_INT8 = replace(_B_FUSED, quantize="int8-dynamic", quant_filter="blog")

LADDER: list[tuple[str, Recipe]] = [
    ("fp32", _B_FP32), ("bf16", _B_BF16), ("+ SDPA", _B_SDPA), ("+ compile", _B_COMPILED),
    ("+ fused QKV", _B_FUSED), ("+ int8 dynamic", _B_INT8)]

# The course's own ladder, beside the blog's: a true fp32 baseline with TF32 as its own step,
# the pipeline's own VAE and scheduler, no 1x1-conv swap, sync removal as its own step, the
# course's own int8 filter, and compile split in two ideas with two waits (04_torch_compile):
# "+ compile" is fusion, torch.compile's default mode with CUDA graphs ("reduce-overhead": the
# default options plus triton.cudagraphs, torch._inductor.list_mode_options; the policy drops
# the graphs where they cannot run) and none of the tuning flags, a minute or so a graph on a
# GPU; "+ autotune", the last step, is max-autotune with the blog's four inductor flags
# (coordinate descent among them) on the step before it: tens of minutes of tuning on a new GPU,
# run only when asked for or read from a bundle (course/planning/autotune.py). Each step changes one
# thing of the one before (tested).
_C_TF32 = replace(BASELINE, dtype="tf32")
_C_BF16 = replace(BASELINE, dtype="bf16")
_C_SDPA = replace(_C_BF16, attention="sdpa")
_C_COMPILED = replace(_C_SDPA, compile="reduce-overhead", fullgraph=True, channels_last=True,
                      compile_vae=True)
_C_FUSED = replace(_C_COMPILED, fuse_qkv=True)
_C_NO_SYNC = replace(_C_FUSED, no_sync=True)
_C_INT8 = replace(_C_NO_SYNC, quantize="int8-dynamic", quant_filter="fastdiff")
# past the blog (15_fp8_hopper.ipynb): fp8 in place of int8, on GPUs with fp8 tensor cores
# (compute capability 8.9+: L4, H100, H200); per row, the faster of torchao's two on FLUX
# (diffusers-torchao's README, H100, both unfused with an eager VAE: 3.039 s against 3.243 s
# per tensor). Refused elsewhere.
_C_FP8 = replace(_C_INT8, quantize="fp8-dynamic-row")
# autotuning on the last step: where fp8 is refused (before compute capability 8.9, a CPU), so
# is this step, and 04_torch_compile.ipynb measures autotuning on the compile step itself
_C_AUTOTUNE = replace(_C_FP8, compile="max-autotune", inductor_flags=True)

COURSE_LADDER: list[tuple[str, Recipe]] = [
    ("fp32, TF32 off", BASELINE), ("+ TF32", _C_TF32), ("bf16", _C_BF16), ("+ SDPA", _C_SDPA),
    ("+ compile", _C_COMPILED), ("+ fused QKV", _C_FUSED), ("+ no sync", _C_NO_SYNC),
    ("+ int8 dynamic", _C_INT8), ("+ fp8 dynamic", _C_FP8), ("+ autotune", _C_AUTOTUNE)]
# Flux's ladder (19_flux.ipynb), the course's own (the blog ran no Flux): the steps
# diffusers-torchao timed on FLUX.1-dev (models/flux.py), each changing one thing. Its
# transformer.to(channels_last) is left out: no tensor of Flux's transformer is 4-D (tested).
_F_BF16 = Recipe(dtype="bf16", attention="sdpa", tf32="blog")
_F_COMPILED = replace(_F_BF16, compile="max-autotune", fullgraph=True, compile_vae=False)
_F_FP8 = replace(_F_COMPILED, quantize="fp8-dynamic", quant_filter="flux")
FLUX_LADDER: list[tuple[str, Recipe]] = [
    ("bf16", _F_BF16), ("+ compile", _F_COMPILED), ("+ fp8 dynamic", _F_FP8),
    ("+ fp8 dynamic row", replace(_F_FP8, quantize="fp8-dynamic-row"))]
LADDERS: dict[str, list[tuple[str, Recipe]]] = {"blog": LADDER, "course": COURSE_LADDER,
                                                "flux": FLUX_LADDER}
