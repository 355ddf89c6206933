"""The Recipe is the one schema every surface reads (issue 58): each field's Knob says its step
(fdh.apply's order, its code in fdh.to_code, its reading back in fdh.current_recipe), its
command-line flag, its widget and its cost key. One round trip over every field and over random
recipes checks the surfaces against it: Recipe -> flags -> Recipe (the command line and
launch_batch), Recipe -> apply -> current_recipe, Recipe -> to_code -> exec on a tiny
pipeline -> current_recipe."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import random

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.runs.cli import build_parser
from fastdiff_helpers.course.runs.launch import recipe_flags, recipe_from_args
from fastdiff_helpers.course.planning.ladders import LADDERS
from fastdiff_helpers.techniques.guidance import cutoff_share
from fastdiff_helpers.techniques.precision import set_tf32, tf32_state
from fastdiff_helpers.techniques.quantization import CONV_FILTERS, select_filter
from fastdiff_helpers.techniques.recipe import KNOBS, Recipe, RecipeError
from fastdiff_helpers.techniques.syncs import no_sync_plan

FIELDS = [f.name for f in dataclasses.fields(Recipe)]
# what makes most single values valid: bf16 for the activation quantizations and the pinned
# half-precision kernels, SDPA for fused QKV, a compile for its options
EASY = dict(dtype="bf16", attention="sdpa", compile="default")


def _values(name: str) -> list:
    """Every value of a field but its default: its choices, else its widget's numbers."""
    knob, default = KNOBS[name], Recipe.__dataclass_fields__[name].default
    values = knob.choices or [v for v in knob.widget if not isinstance(v, str)]
    return [v for v in values if not (v == default and type(v) is type(default))]


# the fields that change nothing without another (canonical() sets them back without it)
NEEDS = {"quant_filter": {"quantize": "int8-weight-only"}, "compile_vae": {"compile": "default"},
         "cache_branch": {"cache_every": 2}}


def _with(name: str, value) -> Recipe:
    """A valid recipe with `name` set to `value`: alone (with what it needs), else on EASY."""
    try:
        return Recipe(**{**NEEDS.get(name, {}), name: value})
    except RecipeError:
        return Recipe(**{**EASY, **NEEDS.get(name, {}), name: value})


def every_value() -> list[Recipe]:
    """One recipe per value of every field (default values included in the others)."""
    return [_with(name, value) for name in FIELDS for value in _values(name)]


def random_recipes(n: int, seed: int = 0) -> list[Recipe]:
    """`n` valid recipes, each field away from its default with probability 1/2: drawn with a
    fixed seed, so the same ones every run."""
    rng, found = random.Random(seed), []
    while len(found) < n:
        chosen = {name: rng.choice(_values(name)) for name in FIELDS if rng.random() < 0.5}
        try:
            found.append(Recipe(**chosen))
        except RecipeError:
            continue
    return found


def test_every_field_has_a_knob_with_its_step_label_and_values():
    assert list(KNOBS) == FIELDS
    for name, knob in KNOBS.items():
        assert knob.step and knob.label and knob.help, name
        assert _values(name), f"{name}: no value to try but its default"


def test_every_field_and_random_recipes_round_trip_through_the_command_line():
    """Recipe -> recipe_flags (what launch_batch passes to `batch`) -> the `batch` command's
    parser -> Recipe: every field's every value, the ladders' steps and 200 random recipes."""
    recipes = every_value() + [r for steps in LADDERS.values() for _, r in steps] + \
        random_recipes(200)
    assert {n for r in recipes for n in FIELDS if getattr(r, n) != getattr(Recipe(), n)} == set(
        FIELDS)
    lost = []
    for recipe in recipes:
        args = build_parser().parse_args(["batch", "--prompts", "p", "--out", "o",
                                          *recipe_flags(recipe)])
        again = recipe_from_args(args)
        if again != recipe:
            lost.append({n: (getattr(recipe, n), getattr(again, n)) for n in FIELDS
                         if getattr(recipe, n) != getattr(again, n)})
    assert not lost, f"{len(lost)} recipes changed on the command line, e.g. {lost[:3]}"


# --- Recipe -> apply -> current_recipe, Recipe -> to_code -> exec -> current_recipe -------------

def canonical(recipe: Recipe) -> Recipe:
    """`recipe` in the one spelling a pipeline reads back as: the fields that change nothing
    without another at their defaults (quant_filter without quantize, compile_vae without
    compile, cache_branch without a step cache), a TF32 mode its dtype implies unset, fp32
    with TF32 on as dtype "tf32", and with another TF32 mode as dtype "fp32"."""
    tf32, dtype = recipe.tf32, recipe.dtype
    if dtype == "fp32" and tf32 == "on":
        dtype, tf32 = "tf32", None
    if dtype == "tf32" and tf32 in ("blog", "guide"):
        dtype = "fp32"
    if tf32 == ("on" if dtype == "tf32" else "off"):
        tf32 = None
    return dataclasses.replace(
        recipe, dtype=dtype, tf32=tf32,
        quant_filter=recipe.quant_filter if recipe.quantize else "blog",
        compile_vae=recipe.compile_vae if recipe.compile else True,
        cache_branch=recipe.cache_branch if recipe.cache_every > 1 else 1)


def on_a_cpu(recipes: list[Recipe], cuda_kernels: bool = False) -> list[Recipe]:
    """The recipes as a CPU runs them (Recipe.for_device), less those it refuses (fp8, and the
    CUDA attention kernels unless `cuda_kernels`: their processors can be set on a CPU)."""
    found = []
    for recipe in recipes:
        recipe = canonical(recipe.for_device("cpu")[0])
        try:
            (dataclasses.replace(recipe, attention="sdpa-math") if cuda_kernels and
             recipe.attention.startswith("sdpa-") else recipe).check_device("cpu")
        except RecipeError:
            continue
        found.append(recipe)
    return list(dict.fromkeys(found))


def model_for(recipe: Recipe) -> str:
    """A tiny model that shows what `recipe` does: Flux for its own filter and a step cache's
    branch past 1, PixArt for
    accelerate's regional compile (which breaks the UNet), SD1.5 for the rest (its PNDM
    scheduler is one whose syncs remove_syncs moves)."""
    if (recipe.quantize and recipe.quant_filter == "flux") or recipe.cache_branch > 1:
        return "flux"  # (its tiny transformer is the one that takes a branch of 2 or 3)
    return "pixart" if recipe.compile_scope == "regional-accelerate" else "sd15"


@pytest.fixture(scope="module")
def fresh():
    """A fresh tiny pipeline of a model, copied from one loaded once per model."""
    loaded = {}

    def make(model: str, dtype: str = "fp32"):
        if (model, dtype) not in loaded:
            loaded[model, dtype] = fdh.load_pipeline(model, weights="tiny", device="cpu",
                                                     dtype=dtype, verbose=False)
        return copy.deepcopy(loaded[model, dtype])
    yield make
    set_tf32("off")


def named(pipe):
    """(name, module) of every module of the denoiser and the VAE."""
    return [item for part in (fdh.get_denoiser(pipe), pipe.vae) for item in part.named_modules()]


def _differ(read: dict, want: dict) -> dict:
    return {k: (read[k], want[k]) for k in want if read[k] != want[k]}


def _covered(recipes: list[Recipe], least: int) -> None:
    """The recipes that ran still set every field away from its default, `least` in all."""
    assert len(recipes) >= least, len(recipes)
    assert {n for r in recipes for n in FIELDS if getattr(r, n) != getattr(Recipe(), n)} == set(
        FIELDS)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_apply_leaves_a_pipeline_that_reads_back_as_its_recipe(fresh, capsys):
    """Recipe -> fdh.apply -> fdh.current_recipe, over every field's every value, the ladders and
    random recipes, each on a fresh tiny pipeline: what the parts read back (the helpers'
    records deciding only where the modules cannot tell) is the recipe as a CPU runs it."""
    recipes = on_a_cpu(every_value() + [r for s in LADDERS.values() for _, r in s]
                       + random_recipes(80, seed=1))
    ran, wrong = [], []
    for recipe in recipes:
        pipe = fresh(model_for(recipe), recipe.weight_dtype)
        try:
            fdh.apply(pipe, recipe)
        except RecipeError:  # what this model refuses (Flux's, a branch it lacks): before work
            continue
        ran.append(recipe)
        if differ := _differ(fdh.current_recipe(pipe), recipe.to_dict()):
            wrong.append((recipe, differ))
    capsys.readouterr()
    assert not wrong, f"{len(wrong)} recipes read back otherwise, e.g. {wrong[:3]}"
    _covered(ran, 80)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_to_code_leaves_a_pipeline_that_reads_back_as_its_recipe(fresh):
    """Recipe -> fdh.to_code(recipe, "plain") -> exec on a fresh tiny pipeline (in a fresh
    process's TF32 state) -> fdh.current_recipe(pipe, records=False): the modules alone read
    back as the recipe, save what no module keeps: "guide" is the TF32 state of "blog"
    (checked below); SD's guidance stop is the callback the code makes for each call (read
    as fdh.benchmark reads it); a sync removal that finds nothing to move, and a quantization
    filter that selects no linear (a 1x1-conv swap's, no conv) of the tiny model, change
    nothing."""
    set_tf32("guide")
    guide = tf32_state()
    set_tf32("blog")
    assert tf32_state() == guide
    recipes = on_a_cpu(every_value() + [r for s in LADDERS.values() for _, r in s]
                       + random_recipes(80, seed=2), cuda_kernels=True)
    ran, wrong = [], []
    for recipe in recipes:
        model = model_for(recipe)
        pipe = fresh(model)
        try:
            code = fdh.to_code(recipe, "plain", model=model)
        except RecipeError:  # what the model refuses (Flux's: techniques/flux.py)
            continue
        torch.backends.cudnn.fp32_precision = "none"  # a fresh process's TF32 settings
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("highest")
        namespace = {"pipe": pipe, "torch": torch, "num_inference_steps": 4}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"<to_code {recipe}>", "exec"), namespace)
        pipe = namespace["pipe"]
        read = fdh.current_recipe(pipe, records=False)
        want = recipe.to_dict()
        if want["tf32"] == "guide":
            want["tf32"] = "blog"
        if "callback" in namespace:
            read["guidance_stop"] = cutoff_share(namespace["callback"], 4, 4)
        if recipe.no_sync and not no_sync_plan(pipe)[0]:
            want["no_sync"] = False
        if recipe.conv1x1_to_linear and not any(
                CONV_FILTERS[recipe.conv1x1_to_linear](m, n) for n, m in named(fresh(model))):
            want["conv1x1_to_linear"] = False
        if recipe.quantize and not any(
                select_filter(recipe.quantize, recipe.quant_filter)(m, n) for n, m in named(pipe)):
            want.update(quantize=None, quant_filter="blog")
        ran.append(recipe)
        if differ := _differ(read, want):
            wrong.append((recipe, differ))
    assert not wrong, f"{len(wrong)} recipes read back otherwise, e.g. {wrong[:3]}"
    _covered(ran, 80)
