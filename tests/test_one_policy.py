"""One policy for GPU-only choices on a CPU (issue 24), the same on every path a newcomer takes:
fdh.apply (docs/helpers.md's one-screen block), the command line, fdh.course.run_ladder (and `make demo`,
which runs it), the playground. Each is stopped before anything compiles (compilation is lazy),
so this is quick; tests/test_recipe_rules.py pins the policy itself against torch's mode options.
"""

from __future__ import annotations

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs import cli
from fastdiff_helpers.errors import FastdiffError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU side of the policy")
ASKED = fdh.course.LADDER[3][1]  # the blog's "+ compile": max-autotune
RAN = "max-autotune-no-cudagraphs"
NOTE = f"compile='max-autotune' on cpu: ran compile='{RAN}'"


def test_apply(capsys):
    pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False),
                     ASKED)
    assert fdh.pipeline_info(pipe).recipe.compile == RAN
    assert NOTE in capsys.readouterr().out


def test_command_line(monkeypatch, capsys):
    seen = {}

    def stop(pipe, **kwargs):  # after apply, before the first (compiling) call
        seen["recipe"] = fdh.pipeline_info(pipe).recipe
        raise FastdiffError("stopped here by the test")

    monkeypatch.setattr(cli, "benchmark", stop)
    assert cli.main(["bench", "--weights", "tiny", "--device", "cpu", "--dtype", "bf16",
                     "--attention", "sdpa", "--compile", "max-autotune"]) == 2
    assert seen["recipe"].compile == RAN and NOTE in capsys.readouterr().out


def test_ladder_and_demo(capsys):
    (result,) = fdh.course.run_ladder("sdxl", weights="tiny", device="cpu", steps_filter=["+ compile"],
                               fail_step="+ compile", progress=False)
    assert result.recipe["compile"] == RAN and any(NOTE in n for n in result.notes)
    assert NOTE in capsys.readouterr().out


def test_playground():
    pytest.importorskip("ipywidgets")
    panel = fdh.playground("sdxl", weights="tiny", device="cpu")
    for name in ("dtype", "attention", "compile"):
        panel.controls[name].value = {"dtype": "bf16", "attention": "sdpa",
                                      "compile": "max-autotune"}[name]
    recipe, notes = panel.recipe()
    assert recipe.compile == RAN and NOTE in notes[0]
    assert f"mode='{RAN}'" in panel.code.value and NOTE in panel.code.value


def test_what_a_cpu_lacks_is_refused_on_every_path(capsys):
    flash = fdh.Recipe(dtype="bf16", attention="sdpa-flash")
    with pytest.raises(fdh.RecipeError, match="CUDA kernel"):
        fdh.apply(fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False), flash)
    assert cli.main(["bench", "--weights", "tiny", "--device", "cpu", "--dtype", "bf16",
                     "--attention", "sdpa-flash"]) == 2
    assert "CUDA kernel" in capsys.readouterr().err
    pytest.importorskip("ipywidgets")
    panel = fdh.playground("sd15", weights="tiny", device="cpu")
    panel.controls["dtype"].value = "bf16"
    panel.controls["attention"].value = "sdpa-flash"
    assert panel.code.value.startswith("# Invalid recipe:") and "CUDA kernel" in panel.code.value
