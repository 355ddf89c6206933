"""The autotune rule (issue 44): on a GPU no compile tunes unless autotuning is switched on or an
imported tuning bundle covers it; coordinate descent's mark survives the compile worker's pickle.

There is no GPU here: the rule reads the device through planning.autotune._gpu, which the
tests answer as a GPU of a given name and SM count would; the rest (the recipe it runs, the
notes, the records, the bundles' coverage) is the package's own code on the tiny models."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.techniques.precision import set_tf32
from fastdiff_helpers import checks
from fastdiff_helpers.course.compiletime import bundle as bundle_format
from fastdiff_helpers.measure import record
from fastdiff_helpers.course.planning import autotune, coordesc, tuning_state
from fastdiff_helpers.course.planning.tuning_state import STATE
from fastdiff_helpers.course.planning.ladders import COURSE_LADDER, LADDER

GATE = autotune.course_tuning  # the course's decision, passed to fdh.apply (settings.tuning)
H100 = ("NVIDIA H100 80GB HBM3", 132)
L4 = ("NVIDIA L4", 58)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test starts with the switch unset, no FASTDIFF_AUTOTUNE and nothing covered, and
    leaves TF32 off (the blog's recipes set it process-wide)."""
    monkeypatch.delenv(autotune.ENV, raising=False)
    STATE.reset()
    yield
    STATE.reset()
    set_tf32("off")


def on_gpu(monkeypatch, gpu=H100):
    monkeypatch.setattr(autotune, "_gpu", lambda device: gpu)


def tiny(model="sd15"):
    return fdh.load_pipeline(model, weights="tiny", device="cpu", verbose=False)


def test_the_switch_is_off_by_default_and_set_by_call_or_environment(monkeypatch):
    assert autotune.autotune_enabled() is False
    monkeypatch.setenv(autotune.ENV, "1")
    assert autotune.autotune_enabled() is True
    fdh.course.set_autotune(False)  # a call wins over the environment
    assert autotune.autotune_enabled() is False
    fdh.course.set_autotune(None)
    assert autotune.autotune_enabled() is True
    with pytest.raises(fdh.RecipeError, match="True, False or None"):
        fdh.course.set_autotune("yes")


@pytest.mark.parametrize("value", ["maybe", "on"])
def test_an_unknown_environment_value_is_said_once_with_the_accepted_ones(monkeypatch, capsys,
                                                                          value):
    """It was taken as off without a word."""
    monkeypatch.setattr(checks, "_SAID", set())
    monkeypatch.setenv(autotune.ENV, value)
    assert autotune.autotune_enabled() is False and autotune.autotune_enabled() is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"FASTDIFF_AUTOTUNE={value!r} is not a value it takes" in out
    assert "autotuning stays off" in out
    assert "1, true, yes switch it on, 0, false, no (or unset) leave it off" in out
    for quiet in ("0", "no", "", "TRUE"):
        monkeypatch.setenv(autotune.ENV, quiet)
        autotune.autotune_enabled()
    assert capsys.readouterr().out == ""


def test_what_tunes_and_its_default_mode_equivalent():
    assert autotune.tunes("max-autotune", False) and autotune.tunes("max-autotune-no-cudagraphs",
                                                                     False)
    assert autotune.tunes("default", True)  # the blog's flags: coordinate descent
    assert not autotune.tunes("reduce-overhead", False) and not autotune.tunes(None, False)
    blog = LADDER[3][1]
    # a tuning mode's default-mode equivalent keeps its CUDA-graph choice (torch's option sets
    # differ by the tuning alone); the blog's step without tuning is its flags off too
    assert autotune.WITHOUT_TUNING == {"max-autotune": "reduce-overhead",
                                       "max-autotune-no-cudagraphs": "default"}
    assert not autotune.tunes(autotune.WITHOUT_TUNING[blog.compile], False)


def test_a_cpu_compile_is_left_as_it_is(monkeypatch):
    """A CPU tunes nothing in these modes: the rule changes nothing there (no GPU here)."""
    pipe = fdh.apply(tiny(), dataclasses.replace(LADDER[3][1], compile_vae=False), tuning=GATE)
    done = fdh.pipeline_info(pipe)
    assert done.applied["compile"]["mode"] == "max-autotune-no-cudagraphs"
    assert "autotune" not in done.applied
    assert not any(n.startswith(autotune.AUTOTUNE_OFF) for n in done.notes)


def test_on_a_gpu_with_autotuning_off_the_blogs_compile_runs_its_default_mode_equivalent(
        monkeypatch, capsys):
    on_gpu(monkeypatch)
    # the tiny pipeline stays on the CPU, so for_device drops the CUDA graphs first: the rule
    # then turns max-autotune-no-cudagraphs into default
    pipe = fdh.apply(tiny(), dataclasses.replace(LADDER[3][1], compile_vae=False), tuning=GATE)
    done = fdh.pipeline_info(pipe)
    ran = done.recipe
    assert (ran.compile, ran.inductor_flags) == ("default", False)
    assert done.requested == dataclasses.replace(LADDER[3][1], compile_vae=False)
    assert fdh.techniques.current_recipe(pipe)["compile"] == "default"
    assert done.applied["compile"]["mode"] == "default"
    assert "inductor_flags" not in done.applied  # none of the four reached inductor
    note = next(n for n in done.notes if n.startswith(autotune.AUTOTUNE_OFF))
    assert "compile='max-autotune-no-cudagraphs'" in note and "GEMM/convolution shapes" in note
    out = capsys.readouterr().out
    assert note in out  # said in one line, before any compile
    assert "estimated wait on this NVIDIA H100 80GB HBM3" in out
    # a Result with that note is flagged wherever its numbers are shown
    flagged = fdh.Result(model="sd15", weights="tiny", step="+ compile", recipe=ran.to_dict(),
                         device_name="NVIDIA H100 80GB HBM3", height=64, width=64, steps=2,
                         notes=[note])
    assert any(f.startswith("not autotuned") for f in flagged.flags)
    assert record.AUTOTUNE_OFF == autotune.AUTOTUNE_OFF


def test_switched_on_it_tunes_and_says_what_it_will_tune(monkeypatch, capsys):
    on_gpu(monkeypatch)
    fdh.course.set_autotune(True)
    pipe = fdh.apply(tiny(), dataclasses.replace(LADDER[3][1], compile_vae=False), tuning=GATE)
    done = fdh.pipeline_info(pipe)
    assert done.recipe.compile == "max-autotune-no-cudagraphs" and done.recipe.inductor_flags
    assert done.applied["inductor_flags"]["coordinate_descent_tuning"] is True
    out = capsys.readouterr().out
    assert "autotuning is on" in out and "plus the tuning" in out


def test_under_68_sms_it_says_no_gemm_template_tunes(monkeypatch):
    on_gpu(monkeypatch, L4)
    words = autotune.tuning_estimate(tiny(), False, L4[1])["words"]
    assert "no GEMM/convolution templates on 58 SMs" in words and "is_big_gpu" in words


def test_a_fusion_step_is_never_touched(monkeypatch, capsys):
    on_gpu(monkeypatch)
    pipe = fdh.apply(tiny(), dataclasses.replace(dict(COURSE_LADDER)["+ compile"],
                                                 compile_vae=False), tuning=GATE)
    assert fdh.pipeline_info(pipe).recipe.compile == "default"  # the CPU's reduce-overhead
    assert "autotune" not in fdh.pipeline_info(pipe).applied
    assert autotune.AUTOTUNE_OFF not in capsys.readouterr().out


def test_a_bundle_that_covers_the_recipe_lets_it_read_its_tuning(monkeypatch, tmp_path, capsys):
    """What a finished tuning step records (its coverage keys) travels in the bundle; importing
    the bundle registers it, and the same recipe on the same model then keeps max-autotune."""
    recipe = dataclasses.replace(LADDER[3][1], compile_vae=False).for_device("cpu")[0]
    keys = autotune.covers("sd15", "tiny", recipe)
    assert len(keys) == 1 and autotune.covers("sd15", "tiny", dict(COURSE_LADDER)["+ compile"]) \
        == []  # fusion leaves nothing to cover
    cache = tmp_path / "cache"
    timings = cache / "cache" / bundle_format.tuning_stamp()["system_hash"]
    timings.parent.mkdir(parents=True)
    timings.write_text(json.dumps({"system": {}, "cache": {"mm": {"[k]": {"highest": {"a": 1.0}}}}}))
    run = {"id": "r1", "steps": {"+ compile": {"state": "measured", "covers": keys},
                                 "+ int8 dynamic": {"state": "cut", "covers": ["not finished"]}}}
    bundle = tmp_path / "sd15.json.gz"
    fdh.course.export_tuning(bundle, model="sd15", cache_dir=cache, run=run, verbose=False)
    on_gpu(monkeypatch)
    assert tuning_state.covered_by("sd15", "tiny", recipe) is None
    done = fdh.course.import_tuning(bundle, cache_dir=tmp_path / "bare", verbose=False)
    assert done["covers"] == 1  # the cut step covers nothing
    assert tuning_state.covered_by("sd15", "tiny", recipe) == str(bundle)
    assert tuning_state.covered_by("sd15", "random", recipe) is None  # another architecture
    pipe = fdh.apply(tiny(), dataclasses.replace(LADDER[3][1], compile_vae=False), tuning=GATE)
    assert fdh.pipeline_info(pipe).recipe.compile == "max-autotune-no-cudagraphs"
    assert f"reads its tuning from {bundle}" in capsys.readouterr().out
    # a compile that is not the covered recipe (here with the VAE) still runs untuned
    other = fdh.apply(tiny(), LADDER[3][1], tuning=GATE)
    assert fdh.pipeline_info(other).recipe.compile == "default"
    STATE.reset()


def test_a_step_that_is_autotuning_alone_is_not_run_where_it_may_not_tune(monkeypatch):
    fp8, tuned = COURSE_LADDER[-2][1], COURSE_LADDER[-1][1]
    assert autotune.is_tuning_step(fp8, tuned)
    assert not autotune.is_tuning_step(COURSE_LADDER[3][1], COURSE_LADDER[4][1])  # fusion
    assert autotune.blocked(tuned, "cuda", "sdxl", "random") is None  # no GPU here
    on_gpu(monkeypatch)
    reason = autotune.blocked(tuned, "cuda", "sdxl", "random")
    assert "autotuning is off" in reason and "--autotune" in reason
    fdh.course.set_autotune(True)
    assert autotune.blocked(tuned, "cuda", "sdxl", "random") is None


def test_the_course_settings_switch_autotuning(monkeypatch):
    settings = fdh.course.settings("sd15", smoke=True)
    assert settings.autotune is False
    assert fdh.course.settings("sd15", smoke=True, autotune=True).autotune is True
    assert autotune.autotune_enabled() is True
    with pytest.raises(fdh.FastdiffError, match="autotune='on' cannot work"):
        fdh.course.settings("sd15", smoke=True, autotune="on")


def test_the_cli_switch(monkeypatch, capsys):
    from fastdiff_helpers.course.runs import cli
    from tools.reference.__main__ import build_parser

    parser = cli.build_parser()
    for command in (["ladder"], ["bench"], ["warm"], ["demo"]):
        assert parser.parse_args(command + ["--autotune"]).autotune is True
        assert parser.parse_args(command).autotune is False
    assert build_parser().parse_args(["--autotune"]).autotune is True  # the reference run's
    assert build_parser().parse_args([]).autotune is False


# --- coordinate descent's mark through the compile worker's pickle ---------------------------

class FieldsOnly:
    """A config class that restores only its own fields when unpickled, as Triton's Config
    does since triton-lang/triton#6595 (python/triton/runtime/autotuner.py): what inductor's
    compile workers pickle back to the parent (torch/_inductor/runtime/compile_tasks.py)."""

    FIELDS = ("kwargs", "num_warps")

    def __init__(self, kwargs, num_warps=4):
        self.kwargs, self.num_warps = kwargs, num_warps

    def __setstate__(self, state):
        for name in self.FIELDS:
            setattr(self, name, state.get(name))


class KeepsAll:
    def __init__(self, kwargs, num_warps=4):
        self.kwargs, self.num_warps = kwargs, num_warps


def test_the_mark_is_lost_through_a_fields_only_pickle_and_kept_once_patched(monkeypatch):
    cls = type("Config", (FieldsOnly,), {"__module__": __name__})
    globals()["Config"] = cls  # picklable by name
    try:
        assert coordesc.marks_lost(cls)
        assert coordesc.keep_coordesc_marks(cls) is True
        config = cls({"XBLOCK": 64}, num_warps=8)
        config.found_by_coordesc = True
        back = pickle.loads(pickle.dumps(config))
        assert back.found_by_coordesc is True and back.kwargs == {"XBLOCK": 64}
        plain = pickle.loads(pickle.dumps(cls({"XBLOCK": 8})))
        assert not getattr(plain, "found_by_coordesc", False)  # only a mark that was there
        assert coordesc.keep_coordesc_marks(cls) is True  # once: not wrapped twice
        assert cls.__setstate__._fastdiff_original is FieldsOnly.__setstate__
    finally:
        del globals()["Config"]


def test_no_patch_where_the_mark_survives_or_there_is_no_triton():
    cls = type("Keeps", (KeepsAll,), {"__module__": __name__})
    globals()["Keeps"] = cls
    try:
        assert not coordesc.marks_lost(cls)
        assert coordesc.keep_coordesc_marks(cls) is False
        assert "__setstate__" not in cls.__dict__
    finally:
        del globals()["Keeps"]
    # this CPU build of torch has no Triton: nothing to patch, nothing imported
    assert coordesc._config_class() is None and coordesc.keep_coordesc_marks() is False


def test_the_run_that_decides_a_redescent_reads_the_mark_the_patch_keeps():
    """Where torch decides: CachingAutotuner.run descends again unless the launcher's config is
    marked (the line this patch serves); check_autotune_cache marks a cached coordesc config."""
    import inspect

    from torch._inductor.runtime import autotune_cache, triton_heuristics

    run = inspect.getsource(triton_heuristics.CachingAutotuner.run)
    assert 'getattr(\n            self.launchers[0].config, "found_by_coordesc", False' in run
    assert "triton_config.found_by_coordesc = True" in inspect.getsource(autotune_cache)


# --- the shapes max-autotune benchmarks ------------------------------------------------------

def test_sdxls_unet_has_the_42_shapes_the_h100_autotuned():
    """Counted on a meta copy: SDXL's UNet at 1024x1024, batch 2, bf16 has 42 distinct GEMM and
    convolution shapes, the number max-autotune autotuned on this project's H100
    (results/h100-80gb-hbm3/sdxl/compile-attempts.log)."""
    assert fdh.course.gemm_shapes("sdxl", vae=False) == 42
    assert fdh.course.gemm_shapes("sdxl") > 42  # the VAE decode adds its convolutions


def test_make_demo_on_a_gpu_runs_the_blogs_ladder_only_when_it_need_not_wait_for_tuning():
    """Issue 44, item 7: on a GPU the blog's compiled steps tune for tens of minutes, so the demo
    runs them only with autotuning on or from bundles that cover all three; otherwise the
    course's fusion-only ladder beside the blog's published figures, and it says which."""
    from fastdiff_helpers.course.runs import demo

    assert demo.demo_ladder("sdxl", "tiny", "cpu")[0] == "blog"  # a CPU tunes nothing
    ladder, why = demo.demo_ladder("sdxl", "random", "cuda")
    assert ladder == "course" and "--autotune" in why and "fusion alone" in why
    compiled = [r.for_device("cuda")[0] for _, r in LADDER if r.compile]
    for recipe in compiled[:2]:  # two of the three covered: still the course's
        for key in autotune.covers("sdxl", "random", recipe):
            tuning_state.cover(key, "results/h100/tuning/sdxl.json.gz")
    assert demo.demo_ladder("sdxl", "random", "cuda")[0] == "course"
    for key in autotune.covers("sdxl", "random", compiled[2]):
        tuning_state.cover(key, "results/h100/tuning/sdxl.json.gz")
    ladder, why = demo.demo_ladder("sdxl", "random", "cuda")
    assert ladder == "blog" and "results/h100/tuning/sdxl.json.gz" in why
    STATE.reset()
    # what the course's ladder compiles, by the course clock: its fusion steps, not "+ autotune"
    # (4 steps of new graphs, UNet and VAE decode each; '+ no sync' is a cache hit on SDXL)
    course = demo.before("sdxl", "random", "cuda", "course")
    assert "compiling 8 graphs" in course and "+ autotune: autotuning on top" in course
    fdh.course.set_autotune(True)
    assert demo.demo_ladder("sdxl", "random", "cuda")[0] == "blog"


def _notebook_compile_calls():
    """Every fdh.apply / fdh.compile_pipeline call in the notebooks' code cells, with whether it
    passes `tuning=` and the device its pipeline is loaded on where the call names it."""
    import ast

    import nbformat

    for path in sorted((Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            code = "\n".join(line for line in cell.source.splitlines()
                             if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(code)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("apply", "compile_pipeline")
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "fdh"):
                    devices = {k.value.value for n in ast.walk(node) if isinstance(n, ast.Call)
                               for k in n.keywords if k.arg == "device"
                               and isinstance(k.value, ast.Constant)}
                    yield (f"{path.name}:{cell.get('id')}", node.func.attr,
                           any(k.arg == "tuning" for k in node.keywords), devices)


def test_every_notebook_compile_passes_the_courses_decision():
    """Issue 58: fdh.apply and fdh.compile_pipeline take the autotune decision as `tuning=`;
    without it a notebook's compile on a GPU would skip the course's rule (a max-autotune
    search of tens of minutes, unsaid) and its compile-cache folder (course_tuning calls
    use_course_cache). Every call passes settings.tuning, but those whose pipeline is loaded
    on the meta device or the CPU by name, which never tune."""
    calls = list(_notebook_compile_calls())
    assert len(calls) >= 20
    missing = [where for where, _, tuned, devices in calls
               if not tuned and not devices & {"meta", "cpu"}]
    assert not missing, missing
