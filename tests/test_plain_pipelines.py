"""The helpers on pipelines loaded with plain diffusers (issue 14): what a user who copies helper
calls into their own notebook has."""

from __future__ import annotations

import numpy as np
import pytest

import fastdiff_helpers as fdh

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _image(pipe) -> np.ndarray:
    kwargs = fdh.call_kwargs(pipe, steps=2)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0]


@pytest.mark.parametrize("model", ["sdxl", "ssd1b", "pixart"])
def test_apply_works_on_a_pipeline_from_plain_from_pretrained(model, tmp_path):
    import diffusers

    ours = fdh.load_pipeline(model, weights="tiny", device="cpu", verbose=False)
    ours.save_pretrained(tmp_path, safe_serialization=True)
    cls = getattr(diffusers, fdh.MODELS[model].pipeline_class)
    theirs = cls.from_pretrained(tmp_path, use_safetensors=True)  # plain diffusers, no fdh
    theirs.set_progress_bar_config(disable=True)

    info = fdh.pipeline_info(theirs)
    assert info.model == model and info.weights == "pretrained"
    assert info.applied == {}
    assert fdh.call_kwargs(theirs)["height"] == 64  # the denoiser's own size, not 1024

    recipe = fdh.Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True)
    fdh.apply(theirs, recipe)
    fdh.apply(ours, recipe)
    assert fdh.current_recipe(theirs) == recipe.to_dict()
    assert np.abs(_image(theirs) - _image(ours)).max() == 0  # the same surgery, the same image
    result = fdh.benchmark(theirs, steps=2, runs=1, warmup=0, progress=False)
    assert result.model == model and result.recipe["fuse_qkv"] is True


def test_a_pipeline_of_another_family_is_refused_with_what_to_do():
    class StableDiffusion3Pipeline:  # stands in for any pipeline the course does not cover
        pass

    with pytest.raises(fdh.FastdiffError, match="not one of the course's pipelines.*load_pipeline"):
        fdh.pipeline_info(StableDiffusion3Pipeline())
