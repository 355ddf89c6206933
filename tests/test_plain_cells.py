"""The technique run as the library's own code (issue 50): in every technique notebook, the cell
that applies the technique (tagged "technique") is plain torch / diffusers / torchao code that a
participant runs and can copy, and it leaves the same pipeline as fdh.apply of the same recipe:
what fdh.current_recipe reads off both (every field, off every part a technique changes), and
the image (equal without compile; within 35 dB PSNR
of the eager image with it, the compiled kernels' rounding).

PLAIN says, for each technique cell, the dtype the notebook loads `pipe` in before it and the
recipe the cell stands for. A cell runs in a namespace of `pipe` (a fresh tiny pipeline of the
notebook's model, in that dtype), `torch`, `fdh`, `settings` (smoke mode) and `prompt`: what it
needs beyond them it imports, so it can be copied as it stands."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {p.name: p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}

# (notebook, cell id) -> (the dtype `pipe` is loaded in before the cell, the recipe it stands for)
PLAIN: dict[tuple[str, str], tuple[str, fdh.Recipe]] = {
    # 01_baseline: TF32 switched off and the classic processor set by hand: the course's baseline
    ("01_baseline.ipynb", "baseline-plain"): ("fp32", fdh.Recipe()),
    # 02_precision: TF32 switched on, then the fp32 pipeline cast to bf16 (the test's fresh
    # pipeline has diffusers' default attention, SDPA; the notebook's has the classic processor)
    # (the cell is the blog's switch, set_float32_matmul_precision("high") with cuDNN's TF32:
    # tf32="blog"; the course's "+ TF32" rung also sets the CUDA-wide level inductor reads)
    ("02_precision.ipynb", "tf32-switch"): ("fp32", fdh.Recipe(tf32="blog", attention="sdpa")),
    ("02_precision.ipynb", "bf16-cast"): ("fp32", fdh.Recipe(dtype="bf16", attention="sdpa")),
    # 03_attention: the classic processor set by hand (the previous rung), then SDPA's back
    ("03_attention.ipynb", "classic-attn"): ("bf16", fdh.Recipe(dtype="bf16", attention="classic")),
    ("03_attention.ipynb", "sdpa-attn"): ("bf16", fdh.Recipe(dtype="bf16", attention="sdpa")),
    # 04_torch_compile: the + compile rung as the CPU runs it (mode "default", the UNet alone),
    # the graph the notebook's smoke run compiles
    ("04_torch_compile.ipynb", "compile-plain"): ("bf16", fdh.Recipe(
        dtype="bf16", attention="sdpa", channels_last=True, compile="default", fullgraph=True,
        compile_vae=False)),
    # 12_cuda_graphs: 04's compile rung in reduce-overhead mode, the UNet alone
    ("12_cuda_graphs.ipynb", "reduce-overhead"): ("bf16", fdh.Recipe(
        dtype="bf16", attention="sdpa", channels_last=True, compile="reduce-overhead",
        fullgraph=True, compile_vae=False)),
    # 06_fused_qkv: diffusers' pipeline call (the course's rung also deletes the unfused copies,
    # which changes neither the recipe read off the pipeline nor the image)
    ("06_fused_qkv.ipynb", "fuse"): ("bf16", fdh.Recipe(dtype="bf16", attention="sdpa",
                                                        fuse_qkv=True)),
    # 07_gpu_syncs: none. Its "swap-scheduler" cell (DPMSolverMultistepScheduler.from_config)
    # swaps the scheduler, which no Recipe field stands for; its "find-syncs" cell
    # (torch.cuda.set_sync_debug_mode) is GPU-only and changes nothing in the pipeline.
    # 08_int8_quantization: the blog's 1x1-conv swap and int8 dynamic with its filter, on a
    # stock bf16 pipeline (SDPA is diffusers' default)
    ("08_int8_quantization.ipynb", "quantize-int8"): ("bf16", fdh.Recipe(
        dtype="bf16", attention="sdpa", conv1x1_to_linear="blog", quantize="int8-dynamic",
        quant_filter="blog")),
    # 15_fp8_hopper: none. Its "fp8-technique" cell is GPU-only (fp8 needs compute capability
    # 8.9+, refused on a CPU), so it cannot run in this CPU test.
    # 09_fewer_denoiser_calls: the course's own step cache (its call stays fdh.step_cache),
    # loaded with diffusers' default attention (SDPA); its scheduler swap and diffusers'
    # guidance callback are no recipe's fields: test_fewer_calls.py runs those two cells
    # against fdh.set_scheduler and fdh.stop_guidance
    ("09_fewer_denoiser_calls.ipynb", "cache-apply"): ("fp32", fdh.Recipe(
        attention="sdpa", cache_every=3, cache_branch=1)),
    # 11_fitting_your_gpu: none. Its "vae-savers" cell (pipe.vae.enable_slicing/enable_tiling)
    # and its GPU-only "offload" cell (pipe.enable_model_cpu_offload) are memory savers, which
    # no Recipe field stands for.
    # 19_flux: none. Its "first-block-cache" cell (enable_cache(FirstBlockCacheConfig)) is a
    # diffusers hook no Recipe field stands for. Its "regional-compile" cell stands for
    # ("bf16", fdh.Recipe(dtype="bf16", attention="sdpa", compile="default",
    # compile_scope="regional", fullgraph=True, compile_vae=False)), but checking it here would
    # be the suite's only inductor compile of Flux (the notebook's smoke run skips the first
    # call: about a minute of CPU time, 114 s wall on a loaded 2-core machine), a new compile;
    # run by hand, fdh.current_recipe read that recipe off it and the image was within 49.5 dB
    # PSNR of the eager one.
}

# Fields a plain cell sets that no module keeps: 09's step cache is one plain function that
# replaces the UNet's forward (issue 59), so reading the pipeline back sees a stock UNet; the
# image, equal to the bit to fdh.apply's cached one (and a cache changes the image), proves it,
# and tests/test_plain_techniques.py holds the function to fdh.step_cache on SDXL and SD1.5
UNREAD = {("09_fewer_denoiser_calls.ipynb", "cache-apply"): ("cache_every", "cache_branch")}


# each technique notebook's own call, in a code cell tagged "technique" (issue 50, item 3)
CALLS = {
    "01": r"set_attn_processor\(AttnProcessor\(\)\)",
    "16": r"torch\.profiler\.profile\(",
    "02": r"torch\.bfloat16",
    "03": r"AttnProcessor2_0|sdpa_kernel\(",
    "04": r"torch\.compile\(|\.compile\(",
    "05": r"torch\.compiler\.(save|load)_cache_artifacts\(",
    "12": r"mode=[\"']reduce-overhead[\"']",
    "14": r"hotswap=True",
    "06": r"\.fuse_qkv_projections\(\)",
    "07": r"set_sync_debug_mode\(|scheduler",
    "08": r"quantize_\(",
    "15": r"quantize_\(",
    "09": r"callback_on_step_end|\.scheduler = ",
    "18": r"split_between_processes\(",
    "11": r"enable_model_cpu_offload\(|enable_tiling\(",
    "19": r"compile_repeated_blocks\(|enable_cache\(",
}


def _cells(name: str):
    nb = json.loads(NOTEBOOKS[name].read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            yield cell["id"], "".join(cell["source"]), cell.get("metadata", {}).get("tags", [])


def _technique_cells():
    return [(name, cell_id, source, tags) for name in NOTEBOOKS
            for cell_id, source, tags in _cells(name) if "technique" in tags]


def test_every_technique_notebook_runs_its_technique_as_the_librarys_own_code():
    found = {}
    for name, _, source, _ in _technique_cells():
        found.setdefault(name[:2], []).append(source)
    missing = [f"{nn}: {pattern}" for nn, pattern in CALLS.items()
               if not any(re.search(pattern, s) for s in found.get(nn, []))]
    assert not missing, ("technique notebooks without a code cell tagged 'technique' that "
                         f"makes the library's own call: {missing}")


def test_every_technique_cell_says_what_it_stands_for():
    """A technique cell that changes the pipeline (a recipe's technique) is in PLAIN; every
    PLAIN entry is a technique cell."""
    cells = {(name, cell_id) for name, cell_id, _, _ in _technique_cells()}
    stale = sorted(set(PLAIN) - cells)
    assert not stale, f"PLAIN names cells that are not technique cells: {stale}"
    assert PLAIN, "no technique cell is tied to a recipe"


def _model(name: str) -> str:
    """The model of the notebook's parameters cell (the first code cell is the install cell)."""
    cell = next(source for _, source, _ in _cells(name) if "fdh.course.settings(" in source)
    return re.search(r"course\.settings\(\s*\"(\w[\w-]*)\"", cell).group(1)


def _image(pipe) -> np.ndarray:
    kwargs = fdh.call_kwargs(pipe, steps=2, seed=0)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0].astype(np.float64)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("key", sorted(PLAIN), ids=[f"{n[:2]}:{c}" for n, c in sorted(PLAIN)])
def test_a_technique_cell_leaves_the_pipeline_fdh_apply_leaves(key, monkeypatch):
    monkeypatch.setenv("FASTDIFF_SMOKE", "1")
    name, cell_id = key
    dtype, recipe = PLAIN[key]
    source = dict((c, s) for c, s, _ in _cells(name))[cell_id]
    model = _model(name)
    settings = fdh.course.settings(model)

    def fresh(load_dtype: str = "fp32"):
        return fdh.load_pipeline(model, weights="tiny", device="cpu", dtype=load_dtype,
                                 verbose=False)

    if recipe.compile:  # the course's cache, where the notebook's smoke run compiled it too
        fdh.course.use_course_cache(verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the same recipe uncompiled (the compile-only fields back to their defaults, which a
        # Recipe without compile requires)
        eager = fdh.apply(fresh(), dataclasses.replace(
            recipe, compile=None, fullgraph=False, inductor_flags=False, compile_scope="full",
            dynamic=None))
        expected = _image(eager)
        namespace = {"pipe": fresh(dtype), "torch": torch, "fdh": fdh, "settings": settings,
                     "prompt": "a photo"}
        exec(compile(source, f"<{name}:{cell_id}>", "exec"), namespace)
        got_pipe = namespace["pipe"]
        got = _image(got_pipe)
    read = fdh.current_recipe(got_pipe)  # every field, read off every part it changes
    wanted = recipe.to_dict()
    differ = {f: (read[f], wanted[f]) for f in wanted
              if read[f] != wanted[f] and f not in UNREAD.get(key, ())}
    assert not differ, f"{name}:{cell_id} leaves (read, recipe): {differ}"
    if recipe.compile:
        assert fdh.compare_images(got, expected)["psnr"] >= 35
    else:
        assert np.array_equal(got, expected)
