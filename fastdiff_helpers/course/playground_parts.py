"""The playground's vocabulary: its controls (one per Recipe field, with readable labels and
choices), its phases, and the small formatters its table and images use. Introduced in
10_playground.ipynb; the panel itself is widgets.py."""

from __future__ import annotations

import io
from typing import Any

from ..models.presets import SCHEDULERS
from ..techniques.codegen import to_code
from ..techniques.recipe import (ATTENTION, BASELINE, COMPILE_MODES, CONV_SWAPS, DTYPES,
                                 QUANT_FILTERS, QUANTIZE, SCOPES, TF32_MODES, Recipe)

# Recipe field -> readable label (the widget's description; the browser test finds it by it).
LABELS = {"dtype": "dtype", "tf32": "TF32", "attention": "attention", "channels_last": "channels_last",
          "compile": "compile", "compile_scope": "compile scope", "compile_vae": "compile VAE",
          "fullgraph": "fullgraph", "dynamic": "dynamic", "inductor_flags": "inductor flags",
          "fuse_qkv": "fused QKV", "no_sync": "no GPU syncs", "quantize": "quantize",
          "quant_filter": "quant filter", "conv1x1_to_linear": "1x1 conv to linear",
          "cache_every": "step cache every", "cache_branch": "cache branch",
          "guidance_stop": "guidance on first"}
# A Dropdown's value None means "nothing selected", so None/True/False travel as words.
_WORDS = {"off": None, "auto": None, "True": True, "False": False}
_CHOICES: dict[str, list] = {
    "dtype": list(DTYPES), "attention": list(ATTENTION),
    "compile": ["off", *COMPILE_MODES[1:]], "compile_scope": list(SCOPES),
    "dynamic": ["auto", "True", "False"], "quantize": ["off", *QUANTIZE[1:]],
    "quant_filter": list(QUANT_FILTERS), "tf32": ["auto", *TF32_MODES],
    "conv1x1_to_linear": ["off", *CONV_SWAPS[1:]],
    # 09_fewer_denoiser_calls: every 1 is no cache; guidance "off" (None) is guidance throughout
    "cache_every": [1, 2, 3, 4, 5], "cache_branch": [1, 2, 3],
    "guidance_stop": ["off", 0.25, 0.5, 0.75]}
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
