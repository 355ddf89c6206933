"""The course's own techniques as code a participant copies and runs without fdh (issue 59,
item 4): the step cache's loop as one function (09), the sync removal's two pieces (07), a kernel
pinned with torch's sdpa_kernel around the UNet (03), and what the course's fused QKV adds to
diffusers' call (06, a fold). Each is taken from its notebook as it stands, run on a tiny
pipeline, and must leave the pipeline fdh.apply leaves for the same recipe: the same image, to
the bit, and the same state where fdh records one."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def _notebook(prefix: str) -> dict:
    [path] = [p for p in (ROOT / "notebooks").glob("*.ipynb") if p.name.startswith(prefix)]
    return json.loads(path.read_text(encoding="utf-8"))


def _cell(prefix: str, cell_id: str) -> str:
    [cell] = [c for c in _notebook(prefix)["cells"] if c["id"] == cell_id]
    assert "technique" in cell["metadata"].get("tags", []) or cell["cell_type"] == "markdown"
    return "".join(cell["source"])


def _tiny(model: str, dtype: str = "fp32"):
    return fdh.load_pipeline(model, weights="tiny", device="cpu", dtype=dtype, verbose=False)


def _image(pipe, steps: int = 7) -> np.ndarray:
    kwargs = fdh.call_kwargs(pipe, steps=steps, seed=0)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0]


def _run(source: str, **namespace) -> dict:
    namespace.setdefault("fdh", fdh)
    namespace.setdefault("torch", torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, "<plain technique>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("model", ["sdxl", "sd15"])
@pytest.mark.parametrize("every, branch", [(3, 1), (2, 1)])  # the tiny UNets take branch 1
def test_the_step_cache_function_leaves_the_image_fdh_step_cache_leaves(model, every, branch):
    """09's function, defined by running its cell, then put on a fresh tiny pipeline: each
    step takes the path fdh's StepPlan takes, and the image is fdh.apply's to the bit (and
    not the uncached one: the cache did something)."""
    ns = _run(_cell("09_", "cache-apply"), pipe=_tiny("sdxl"))
    pipe = _tiny(model)
    log = ns["step_cache"](pipe, every=every, branch=branch)
    got = _image(pipe)
    wanted_pipe = fdh.apply(_tiny(model), fdh.Recipe(attention="sdpa", cache_every=every,
                                                     cache_branch=branch))
    wanted = _image(wanted_pipe)
    assert np.array_equal(got, wanted)
    plan = fdh.pipeline_info(wanted_pipe).step_plan.log
    assert log == plan and [p for _, p, _ in log].count("cached") >= 3
    assert not np.array_equal(got, _image(_tiny(model)))


def test_the_sync_removal_leaves_the_pipeline_fdh_apply_leaves():
    """07's two pieces on a tiny SD1.5 (PNDM): the schedule stays on the CPU whatever device a
    pipeline asks for, one pre-hook on the UNet, and PNDM's image unchanged, as
    fdh.apply(Recipe(no_sync=True)) leaves it."""
    plain = _run(_cell("07_", "plain-no-sync"), pipe=_tiny("sd15"))["pipe"]
    ours = fdh.apply(_tiny("sd15"), fdh.Recipe(attention="sdpa", no_sync=True))
    assert type(plain.scheduler).__name__ == type(ours.scheduler).__name__ == "PNDMScheduler"
    assert fdh.pipeline_info(ours).applied["no_sync"]["changed"] is True
    for pipe in (plain, ours):
        pipe.scheduler.set_timesteps(4, device=torch.device("meta"))  # a GPU, say: ignored
        assert pipe.scheduler.timesteps.device.type == "cpu"
        assert len(pipe.unet._forward_pre_hooks) == 1
    image = _image(plain)
    assert np.array_equal(image, _image(ours))
    assert np.array_equal(image, _image(_tiny("sd15")))  # same math: PNDM's own image


def test_the_kernel_pinned_around_the_unet_is_fdh_set_attention():
    """03's wrapper with flash (which a CPU runs in bf16) pins every UNet attention, as
    fdh.set_attention(pipe, "sdpa-flash") does (the recipe's attention="sdpa-flash"); the image
    is the same, and every attention the UNet runs has flash alone to choose from."""
    pipe = _tiny("sdxl", "bf16")
    ns = _run(_cell("03_", "nb03-09"), pipe=pipe)
    from torch.nn.attention import SDPBackend

    assert pipe.unet.forward is not ns["unet_forward"]  # the cell pinned MATH
    pipe.unet.forward = ns["unet_with_kernel"](SDPBackend.FLASH_ATTENTION)
    ours = fdh.set_attention(_tiny("sdxl", "bf16"), "sdpa-flash")  # (a Recipe refuses it on a CPU)
    assert fdh.pipeline_info(ours).attention_pinned["UNet2DConditionModel"] > 0
    assert np.array_equal(_image(pipe, steps=2), _image(ours, steps=2))
    calls, inside = [], []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # which kernels sdpa_kernel allows, at each call in the UNet
        if inside:
            calls.append(torch.backends.cuda.flash_sdp_enabled()
                         and not torch.backends.cuda.math_sdp_enabled())
        return original(*args, **kwargs)

    hooks = [pipe.unet.register_forward_pre_hook(lambda *a: inside.append(1)),
             pipe.unet.register_forward_hook(lambda *a: inside.clear())]
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        pipe.unet.forward = ns["unet_with_kernel"](SDPBackend.FLASH_ATTENTION)
        kwargs = fdh.call_kwargs(pipe, steps=1, seed=0)
        kwargs["output_type"] = "latent"
        pipe(**kwargs)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
        for hook in hooks:
            hook.remove()
    assert calls and all(calls)  # every attention the UNet ran had flash alone


def test_the_fused_qkv_fold_deletes_what_fdh_fuse_qkv_deletes():
    """06's fold: after diffusers' pipe.fuse_qkv_projections(), the loop over the fused
    attentions leaves the UNet and the VAE the parameters fdh.fuse_qkv leaves (diffusers alone
    keeps the unfused copies), and the same image."""
    fold = next(b for b in FENCE.findall(_cell("06_", "nb05-04")) if "delattr" in b)
    plain = _tiny("sdxl")
    kept = sum(p.numel() for p in plain.unet.parameters())
    plain.fuse_qkv_projections()
    assert sum(p.numel() for p in plain.unet.parameters()) > kept  # diffusers keeps the copies
    _run(fold, pipe=plain)
    ours = fdh.apply(_tiny("sdxl"), fdh.Recipe(attention="sdpa", fuse_qkv=True))
    for part in ("unet", "vae"):
        assert (sum(p.numel() for p in getattr(plain, part).parameters())
                == sum(p.numel() for p in getattr(ours, part).parameters()))
    assert sum(p.numel() for p in plain.unet.parameters()) == kept
    assert np.array_equal(_image(plain, steps=2), _image(ours, steps=2))
