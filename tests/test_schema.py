"""The Recipe is the one schema every surface reads (issue 58): each field's Knob says its step
(fdh.apply's order, its code in fdh.to_code, its reading back in fdh.current_recipe), its
command-line flag, its widget and its cost key. One round trip over every field and over random
recipes checks the surfaces against it: Recipe -> flags -> Recipe (the command line and
launch_batch), Recipe -> apply -> current_recipe, Recipe -> to_code -> exec on a tiny
pipeline -> current_recipe."""

from __future__ import annotations

import dataclasses
import random

from fastdiff_helpers.runs.cli import build_parser
from fastdiff_helpers.runs.launch import recipe_flags, recipe_from_args
from fastdiff_helpers.techniques.ladders import LADDERS
from fastdiff_helpers.techniques.recipe import KNOBS, Recipe, RecipeError

FIELDS = [f.name for f in dataclasses.fields(Recipe)]
# what makes most single values valid: bf16 for the activation quantizations and the pinned
# half-precision kernels, SDPA for fused QKV, a compile for its options
EASY = dict(dtype="bf16", attention="sdpa", compile="default")


def _values(name: str) -> list:
    """Every value of a field but its default: its choices, else its widget's numbers."""
    knob, default = KNOBS[name], Recipe.__dataclass_fields__[name].default
    values = knob.choices or [v for v in knob.widget if not isinstance(v, str)]
    return [v for v in values if not (v == default and type(v) is type(default))]


def _with(name: str, value) -> Recipe:
    """A valid recipe with `name` set to `value`: alone, else on EASY."""
    try:
        return Recipe(**{name: value})
    except RecipeError:
        return Recipe(**{**EASY, name: value})


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
