"""fdh.playground(): the ipywidgets panel, driven without a browser (tiny models, CPU)."""

import re
from dataclasses import replace

import pytest
import torch

pytest.importorskip("ipywidgets")

from fastdiff_helpers.results import playground as widgets  # noqa: E402
from fastdiff_helpers.techniques.recipe import Recipe  # noqa: E402


def _panel():
    panel = widgets.playground("sd15", weights="tiny", device="cpu")
    c = panel.controls
    c["steps"].value, c["runs"].value, c["warmup"].value = 2, 1, 0
    return panel


def _body_rows(panel) -> list[str]:
    body = re.search(r"<tbody>(.*)</tbody>", panel.table.value, re.S).group(1)
    return re.findall(r"<tr>.*?</tr>", body, re.S)


def _chart_png(panel):
    outputs = panel.chart.outputs
    return outputs[-1]["data"]["image/png"] if outputs else None


@pytest.fixture(scope="module")
def two_runs():
    """A panel after a baseline run (button click) and a bf16 run (run())."""
    panel = _panel()
    panel.run_button.click()
    after_first = dict(rows=len(_body_rows(panel)), chart=_chart_png(panel),
                       error=panel.error.value)
    code_before = panel.code.value
    panel.controls["dtype"].value = "bf16"
    code_after = panel.code.value
    result = panel.run()
    return panel, after_first, code_before, code_after, result


def test_controls_have_readable_labels_and_one_per_recipe_field():
    panel = _panel()
    fields = set(Recipe.__dataclass_fields__)
    assert fields <= set(panel.controls)
    assert {"model", "steps", "resolution", "runs", "warmup"} <= set(panel.controls)
    descriptions = {name: w.description for name, w in panel.controls.items()}
    assert descriptions["channels_last"] == "channels_last"
    assert descriptions["fuse_qkv"] == "fused QKV"
    assert descriptions["no_sync"] == "no GPU syncs"
    assert type(panel.controls["channels_last"]).__name__ == "Checkbox"
    assert type(panel.controls["dtype"]).__name__ == "Dropdown"
    assert panel.controls["compile"].value == "off" and panel.controls["dynamic"].value == "auto"
    assert panel.run_button.description == "Run"
    assert "baseline" in panel.widget.children[0].value
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert panel.rows == [] and "<tbody></tbody>" in panel.table.value


def test_code_follows_the_controls_and_shows_invalid_combinations():
    """The box holds what a participant copies: the technique alone in plain diffusers / torch
    code (fdh.to_code(recipe, "plain", model=...)), no fdh call, for the model selected."""
    panel = _panel()
    assert "pipe.unet.set_attn_processor(AttnProcessor())" in panel.code.value  # classic
    assert "fdh" not in panel.code.value and "set_precision" not in panel.code.value
    panel.controls["dtype"].value = "bf16"
    assert "pipe.to(torch.bfloat16)" in panel.code.value
    panel.controls["fuse_qkv"].value = True  # classic attention cannot fuse
    assert panel.code.value.startswith("# Invalid recipe:") and "fuse_qkv" in panel.code.value
    panel.controls["attention"].value = "sdpa"
    assert "pipe.unet.fuse_qkv_projections()" in panel.code.value
    assert "AttnProcessor()" not in panel.code.value  # SDPA is diffusers' default: not written
    panel.controls["scheduler"].value = "dpm-solver"
    assert ("pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)"
            in panel.code.value)
    panel.controls["model"].value = "pixart"  # the code names the model's own denoiser
    assert "pipe.transformer.fuse_qkv_projections()" in panel.code.value
    panel.controls["model"].value = "sd15"
    panel.controls["compile"].value = "max-autotune"  # adapted on a CPU, with a note
    assert "pipe.unet.compile(mode='max-autotune-no-cudagraphs')" in panel.code.value
    assert panel.code.value.startswith("# ") and "CUDA graphs" in panel.code.value.split("\n")[0]
    assert "CUDA graphs" in panel.notes.value and "see fdh.Recipe" in panel.notes.value
    for name, value in (("dtype", "fp32"), ("fuse_qkv", False), ("compile", "off"),
                        ("scheduler", "own")):
        panel.controls[name].value = value
    assert panel.code.value.startswith("# nothing to add")  # fp32 with SDPA: a stock pipeline


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_code_box_run_on_a_loaded_pipeline_gives_the_panels_recipe():
    """Pasted under a pipeline as diffusers loads it, the box's code leaves the recipe the
    panel runs (what fdh.current_recipe reads) and the scheduler it swaps in."""
    import fastdiff_helpers as fdh

    panel = _panel()
    for name, value in (("dtype", "bf16"), ("attention", "sdpa"), ("fuse_qkv", True),
                        ("channels_last", True), ("scheduler", "euler")):
        panel.controls[name].value = value
    recipe, _ = panel.recipe()
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)
    namespace = {"pipe": pipe}
    exec(compile(panel.code.value, "<recipe as code>", "exec"), namespace)
    read, wanted = fdh.current_recipe(pipe), recipe.to_dict()
    fields = ("dtype", "attention", "channels_last", "fuse_qkv", "quantize", "compile")
    assert {f: read[f] for f in fields} == {f: wanted[f] for f in fields}
    assert type(pipe.scheduler).__name__ == "EulerDiscreteScheduler"


def test_run_adds_a_row_with_the_recipe_chart_and_images(two_runs):
    panel, first, code_before, code_after, result = two_runs
    assert first["error"] == "" and first["rows"] == 1 and first["chart"] is not None
    assert code_before != code_after and "pipe.to(torch.bfloat16)" in code_after
    assert result is panel.rows[-1] and len(panel.rows) == 2
    assert panel.rows[0].recipe["dtype"] == "fp32"
    assert panel.rows[-1].recipe["dtype"] == "bf16" and panel.rows[-1].step == "bf16"
    rows = _body_rows(panel)
    assert len(rows) == 2
    assert "baseline" in rows[0] and "bf16" in rows[1] and "sd15" in rows[1]
    assert re.search(r"\d+\.\d\dx", rows[1])  # speed-up vs the baseline
    assert re.search(r"\d+\.\d dB|identical", rows[1])  # PSNR vs the baseline
    assert 35 < panel.rows[-1].quality["psnr"] < 60  # bf16's cost: 45-47 dB on tiny sd15
    assert panel.error.value == ""
    assert _chart_png(panel) is not None and _chart_png(panel) != first["chart"]
    assert bytes(panel.images[0].value).startswith(b"\x89PNG")
    assert bytes(panel.images[1].value).startswith(b"\x89PNG")
    assert "PSNR" in panel.captions[1].value
    assert panel.progress.value == panel.progress.max and not panel.run_button.disabled


def test_invalid_combination_is_shown_and_the_next_run_works():
    panel = _panel()
    panel.controls["attention"].value = "sdpa-flash"  # a CUDA kernel: refused on a CPU
    assert panel.run() is None
    assert "sdpa-flash" in panel.error.value and "Invalid recipe" in panel.error.value
    assert panel.rows == [] and not panel.run_button.disabled
    panel.controls["attention"].value = "classic"
    panel.controls["fuse_qkv"].value = True  # invalid by itself: fusing needs SDPA
    panel.run_button.click()
    assert "fuse_qkv" in panel.error.value and panel.rows == []
    panel.controls["fuse_qkv"].value = False
    panel.controls["channels_last"].value = True
    result = panel.run()
    assert result is not None and panel.error.value == ""
    assert len(_body_rows(panel)) == 1 and "channels_last" in _body_rows(panel)[0]


def test_failures_during_a_run_stay_in_the_panel(monkeypatch):
    panel = _panel()

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(widgets, "load_pipeline", out_of_memory)
    assert panel.run() is None
    assert "Out of memory" in panel.error.value and "lower resolution" in panel.error.value
    monkeypatch.undo()

    def compile_failure(*args, **kwargs):
        raise RuntimeError("inductor: C++ compile error")

    monkeypatch.setattr(widgets, "benchmark", compile_failure)
    assert panel.run() is None
    assert "Run failed (RuntimeError)" in panel.error.value and "inductor" in panel.error.value
    assert panel.status.value == "failed" and not panel.run_button.disabled
    monkeypatch.undo()
    assert panel.run() is not None and len(panel.rows) == 1 and panel.error.value == ""


def test_a_run_loads_the_weights_in_the_dtype_its_recipe_runs_in(monkeypatch):
    """As the notebooks load a rung (dtype=recipe.weight_dtype): a bf16 recipe fetches half-
    precision files, never fp32 ones cast (SDXL's fp32 does not fit a T4); the fp32 baseline
    and TF32 (a matmul setting) load fp32. The default recipe is the card's baseline."""
    import fastdiff_helpers as fdh

    panel = _panel()
    assert panel.recipe()[0] == Recipe()  # fp32: no course settings given
    asked = []
    real = widgets.load_pipeline

    def recording(*args, **kwargs):
        asked.append(kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(widgets, "load_pipeline", recording)
    for dtype in ("fp32", "tf32", "bf16"):
        panel.controls["dtype"].value = dtype
        assert panel.run() is not None, panel.error.value
    assert asked == ["fp32", "fp32", "bf16"]
    assert [r.recipe["dtype"] for r in panel.rows] == ["fp32", "tf32", "bf16"]
    assert panel.rows[2].quality["psnr"] > 35  # against the fp32 baseline, loaded in fp32
    t4 = replace(fdh.course.settings("sdxl"), baseline_dtype="fp16")  # fp32 does not fit
    assert widgets.playground("sdxl", weights="tiny", device="cpu",
                              settings=t4).controls["dtype"].value == "fp16"


def test_the_course_hooks_in_through_settings_and_the_panel_runs_without_it(monkeypatch):
    """Issue 58: the panel is the core's and imports nothing of the course layer. Without
    settings it starts from the model's own steps, fdh.benchmark's runs and warm-up, the fp32
    baseline, and passes no tuning to fdh.apply; given fdh.course.settings(...), its model,
    weights, steps, runs, warm-up and baseline are the defaults, smoke mode caps the timed
    runs, and fdh.apply gets the course's autotune decision (settings.tuning)."""
    import fastdiff_helpers as fdh

    plain = widgets.playground("sd15", weights="tiny", device="cpu")
    c = plain.controls
    assert (c["model"].value, c["steps"].value, c["runs"].value, c["warmup"].value) == (
        "sd15", fdh.MODELS["sd15"].steps, 5, 2)
    assert plain.recipe()[0] == Recipe() and plain.tuning is None and plain.max_runs(3) is None
    settings = replace(fdh.course.settings("sd15", weights="tiny"), steps=3, runs=2, warmup=1,
                       smoke=True, baseline_dtype="bf16")
    panel = widgets.playground(device="cpu", settings=settings)
    c = panel.controls
    assert (c["model"].value, panel.weights, c["steps"].value, c["runs"].value,
            c["warmup"].value, c["dtype"].value) == ("sd15", "tiny", 3, 2, 1, "bf16")
    assert panel.max_runs(2) == 2 and panel.tuning is settings.tuning
    passed = []
    monkeypatch.setattr(widgets, "apply", lambda pipe, recipe, tuning=None: passed.append(tuning))
    c["steps"].value, c["runs"].value, c["warmup"].value = 1, 1, 0
    assert panel.run() is not None, panel.error.value
    assert passed == [settings.tuning]


def test_reset_clears_the_table_chart_and_baselines(two_runs):
    panel = two_runs[0]
    panel.reset_button.click()
    assert panel.rows == [] and panel.baselines == {}
    assert _body_rows(panel) == [] and panel.chart.outputs == ()
    assert bytes(panel.images[1].value) == b""


def test_describe_recipe_names_what_changed():
    assert widgets.describe_recipe(Recipe()) == "fp32"
    r = Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True, compile="default",
               compile_vae=False)
    assert widgets.describe_recipe(r) == ("bf16, attention=sdpa, compile=default, "
                                          "no compile VAE, fused QKV")


def test_a_long_phase_shows_its_elapsed_time_and_a_failure_is_not_frozen(monkeypatch):
    import time as _time

    from fastdiff_helpers.results import playground as widgets

    panel = _panel()
    seen = []

    def slow_benchmark(*args, **kwargs):
        _time.sleep(2.6)  # a compile-length pause, shortened
        seen.append(panel.status.value)
        raise RuntimeError("inductor failed")

    monkeypatch.setattr(widgets, "benchmark", slow_benchmark)
    assert all(image.layout.visibility == "hidden" for image in panel.images)  # no broken icon
    assert panel.run() is None
    assert seen and seen[0].startswith("cold start (compiling), warm-up and timing: ")
    assert seen[0].endswith(" s") and int(seen[0].split(": ")[1][:-2]) >= 1
    assert panel.status.value == "failed" and panel.progress.bar_style == "danger"
    _time.sleep(1.5)
    assert panel.status.value == "failed"  # the ticker stopped with the run
