"""The playground's vocabulary: its controls (one per Recipe field, with readable labels and
choices), its phases, and the small formatters its table and images use. Introduced in
10_playground.ipynb; the panel itself is widgets.py."""

from __future__ import annotations

import io
from typing import Any

from ..models.presets import SCHEDULERS
from ..techniques.codegen import to_code
from ..techniques.recipe import BASELINE, KNOBS, Recipe

# Recipe field -> readable label (the widget's description; the browser test finds it by it)
LABELS = {name: knob.label for name, knob in KNOBS.items()}
# A Dropdown's value None means "nothing selected", so None/True/False travel as words (a
# field's Knob.unset: "off" or "auto"); a True/False field is a checkbox
_WORDS = {"off": None, "auto": None, "True": True, "False": False}
_CHOICES: dict[str, list] = {
    name: list(knob.widget) or [knob.unset if v is None or v is False else v
                                for v in knob.choices]
    for name, knob in KNOBS.items() if knob.choices != (False, True)}
RESOLUTIONS = [("model default", 0)] + [(f"{n}x{n}", n) for n in (64, 128, 256, 512, 768, 1024)]
_PHASES = ["idle", "loading the pipeline", "applying the recipe",
           "cold start (compiling), warm-up and timing", "comparing with the baseline", "done"]


SCHEDULER_CHOICES = ["own", *SCHEDULERS]  # the pipeline's own, or a swap (fdh.set_scheduler)


def describe_recipe(recipe: Recipe, scheduler: str = "own") -> str:
    """A short label: the dtype, then every field that differs from the fp32 baseline, and a
    scheduler swap."""
    parts = [recipe.dtype] + ([] if scheduler == "own" else [f"scheduler={scheduler}"])
    for name in recipe.changes(BASELINE):
        value = getattr(recipe, name)
        if name == "dtype":
            continue
        if isinstance(value, bool):
            parts.append(LABELS[name] if value else f"no {LABELS[name]}")
        else:
            parts.append(f"{LABELS[name]}={'off' if value is None else value}")
    return ", ".join(parts)


CODE_HEAD = "# on `pipe`, a diffusers pipeline as from_pretrained loads it (fp32)\n"
NOTHING_TO_ADD = "# nothing to add: a diffusers pipeline loaded in fp32 runs this recipe as it is\n"


def recipe_code(recipe: Recipe, model: str, scheduler: str = "own",
                notes: list[str] | tuple[str, ...] = ()) -> str:
    """What the panel's "recipe as code" box holds, for a participant to copy: the notes as
    comments, then the technique alone in plain diffusers / torch / torchao code
    (fdh.to_code(recipe, "plain", model=model)) and the scheduler swap, if any. Raises
    RecipeError where the recipe cannot be written for `model` (as fdh.apply refuses it)."""
    code = to_code(recipe, "plain", model=model).strip()
    if scheduler != "own":  # what fdh.set_scheduler does (09_fewer_denoiser_calls)
        swap = (f"from diffusers import {SCHEDULERS[scheduler]}\n"
                f"pipe.scheduler = {SCHEDULERS[scheduler]}.from_config(pipe.scheduler.config)")
        code = f"{code}\n\n{swap}" if code else swap
    body = CODE_HEAD + code + "\n" if code else NOTHING_TO_ADD
    return "".join(f"# {n}\n" for n in notes) + body


def _png(image_or_figure: Any) -> bytes:
    buf = io.BytesIO()
    if hasattr(image_or_figure, "savefig"):
        image_or_figure.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    else:
        image_or_figure.save(buf, format="PNG")
    return buf.getvalue()


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
