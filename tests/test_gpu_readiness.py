"""GPU readiness (issue 11): what the first GPU run would hit, each decision pinned on the CPU."""

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.recipe import RecipeError


def fresh(model):
    return fdh.load_pipeline(model, weights="tiny", device="cpu")


def test_graph_breaks_keeps_other_compiled_pipelines():
    """torch._dynamo.explain() resets dynamo: every compiled model would recompile (or, after
    the reset, silently run a stale wrapper). graph_breaks must leave them alone."""
    compiled_graphs = []

    def backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    kept = fresh("sd15")
    kept.unet.compile(backend=backend)  # what compile_pipeline does, with a cheap backend
    call = fdh.call_kwargs(kept, steps=2)
    call["output_type"] = "latent"
    with torch.inference_mode():
        kept(**call)
    compiled = len(compiled_graphs)
    assert compiled >= 1
    report = fdh.graph_breaks(fresh("sd15"), verbose=False)  # same UNet class, another pipe
    assert report["graphs"] == 1 and report["graph_breaks"] == 0 and report["ops"] > 50
    with torch.inference_mode():
        kept(**call)
    assert len(compiled_graphs) == compiled  # no recompile: its cache survived
    again = fdh.graph_breaks(fresh("sd15"), verbose=False)  # repeatable, no stale entries
    assert again["graphs"] == 1 and again["ops"] == report["ops"]


@pytest.mark.parametrize("mode, runs", [("max-autotune", "max-autotune-no-cudagraphs"),
                                        ("reduce-overhead", "default")])
def test_regional_compile_never_captures_per_block_cuda_graphs(mode, runs):
    recipe = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode, compile_scope="regional")
    adapted, notes = recipe.for_device("cuda:0")
    assert adapted.compile == runs and adapted.compile_scope == "regional"
    assert adapted.changes(recipe) == ["compile"] and "152887" in notes[0]
    adapted.check_device("cuda:0")  # the adapted recipe passes
    with pytest.raises(RecipeError, match=f"compile='{runs}' with 'regional'"):
        recipe.check_device("cuda:0")  # fdh.apply refuses the original before any work
    full = fdh.Recipe(dtype="bf16", attention="sdpa", compile=mode)
    assert full.for_device("cuda:0") == (full, [])  # whole-denoiser graphs are fine
    assert recipe.for_device("cpu")[0].compile == "default"  # CPU: no graphs at all


def test_compile_pipeline_refuses_regional_cuda_graphs_on_cuda(monkeypatch):
    from fastdiff_helpers.techniques import compile as comp

    pipe = fresh("sd15")
    monkeypatch.setattr(comp, "pipeline_device", lambda p: torch.device("cuda", 0))
    with pytest.raises(RecipeError, match="152887"):
        fdh.compile_pipeline(pipe, mode="max-autotune", scope="regional")
    assert "compile" not in fdh.pipeline_info(pipe)["applied"]
