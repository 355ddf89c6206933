"""GPU readiness (issue 11): what the first GPU run would hit, each decision pinned on the CPU."""

import numpy as np
import pytest
import torch

import fastdiff_helpers as fdh


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
