"""How long one image takes: `fdh.course.image_seconds(gpu, model, rung, ladder="course")`, the one
estimate the plan, the course clock, course_settings' timed runs and the commands ask.

Documented in docs/workshop.md ("The course clock"). Seconds at the model's native size and
the course's steps, batch 1 (size= and batch= scale it by pixels and images: an estimate).
Built on the figures of published.py, each converted to the course's steps by FLOPs (FLOPS
below), per precision path:

- "sdpa" (half precision, SDPA, eager): the card's own figure; else, where one source timed
  this card and another, that card's estimate times the source's ratio of the two; else, from
  the card's figure for another model (SDXL first, the model every chain passes through) times
  the ratio of the two models on the nearest card that measured both, taken from its compiled
  rows where this card's compile gain is at most COMPUTE_BOUND (its eager run is then bound by
  compute, not by launches), from its eager rows otherwise; else the nearest card's estimate
  scaled by the datasheets' tensor TFLOPS ("scaled");
- "half" (classic attention) and "tf32": the card's measured ratio to its "sdpa" figure, else
  its ratio for the nearest model, else the nearest card's; never below 1 (never faster than
  "sdpa"); a card without TF32 (before compute capability 8.0) runs "tf32" as "fp32";
- "fp32" (TF32 off): the card's own figure (SDXL on this project's H100, 12.96 s); else
  computed as the FLOPs at the card's FP32 datasheet rate times FP32_SHARE, the share the
  H100's measured figure reached, and never faster than the card's "tf32" (or "half")
  estimate;
- "compiled": "sdpa" over the compile gain (a source's eager over its compiled figure), the
  card's own for the model, else its own for the nearest model, else the nearest card's: a
  small card's gain never comes from a large one; never below 1;
- steps past compile: the blog's A100 ratio (fused QKV, int8) or diffusers-torchao's H100 ratio
  (Flux's fp8) to the compiled step; a step no one measured counts as the step before.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from ... import checks
from ...errors import FastdiffError
from ...models.dtypes import fp32_or_half
from .gpus import PROFILES, GpuProfile
from ...models.presets import get_spec
from .ladders import LADDERS
from ...techniques.recipe import KNOBS, Recipe
from .published import BLOG_A100_SECONDS, FLUX_H100_SECONDS, OTHER_CARDS, PUBLISHED, Published

__all__ = ["image_seconds", "image_basis", "kind_seconds", "PATHS"]

PATHS = ("fp32", "tf32", "half", "sdpa", "compiled")
# TFLOP a denoising step and TFLOP of the rest of an image (text encoders, VAE decode):
# fdh.count_flops(model) on the full-size architecture, denoiser_total / steps and
# per_image - denoiser_total (tests/test_image_time.py recounts them)
FLOPS = {"sdxl": (13.5225, 10.582), "sd15": (1.6601, 2.541), "ssd1b": (8.4155, 10.581),
         "pixart": (13.0190, 12.704), "flux": (74.385, 15.330)}
# true fp32's share of the FP32 datasheet rate, as the H100 ran SDXL with TF32 off
# (published.py: 12.96 s, results/h100-80gb-hbm3/sdxl-course/): 416.3 TFLOP in 12.96 s against
# 67 TFLOP/s, about 0.48 (set below, from the figure)
FP32_SHARE = 0.0
# a choice, between the T4's measured SD1.5 gain (1.06) and the blog's A100 gains (1.16-2.36)
COMPUTE_BOUND = 1.25
# the clock's three kinds of work (models/clock_log.kind) as the rungs that run them
KIND_RUNGS = {"course": {"fp32": "fp32, TF32 off", "half": "+ SDPA", "compiled": "+ compile"},
              "flux": {"fp32": "fp32, TF32 off", "half": "bf16", "compiled": "+ compile"}}


def _model(model: str) -> str:
    spec = get_spec(model)
    return "flux" if spec.family == "flux" else spec.key


def image_flops(model: str, steps: int) -> float:
    step, rest = FLOPS[_model(model)]
    return step * steps + rest


def course_seconds(p: Published) -> float:
    """A published figure as the seconds of one image at the course's steps (the model's)."""
    steps = get_spec(p.model).steps
    if p.unit == "it/s":  # denoising only: the rest of the image added by its FLOPs
        return steps / p.figure * image_flops(p.model, steps) / (FLOPS[p.model][0] * steps)
    return p.figure * image_flops(p.model, steps) / image_flops(p.model, p.steps)


# --- the cards -------------------------------------------------------------------------------

def _card(gpu: Any) -> dict[str, Any]:
    if isinstance(gpu, GpuProfile):
        return {"key": gpu.key, "tflops": gpu.tflops, "fp32": gpu.fp32_tflops,
                "capability": gpu.capability, "profile": gpu.key in PROFILES}
    if gpu in PROFILES:
        return _card(PROFILES[gpu])
    if gpu in OTHER_CARDS:
        c = OTHER_CARDS[gpu]
        return {"key": gpu, "tflops": c["tflops"], "fp32": c["fp32_tflops"],
                "capability": c["capability"], "profile": False}
    raise FastdiffError(f"Unknown GPU {gpu!r}: use one of {', '.join(PROFILES)} (a GPU "
                        "profile's key, as fdh.course.gpu_profile takes), or a profile "
                        "(fdh.course.gpu_profile()).")


# the cards an image time is estimated for, by key, in order (sizing.py CARDS: memory sizes)
CARD_KEYS = tuple(PROFILES) + tuple(OTHER_CARDS)


def _nearest(card: dict, candidates) -> str | None:
    """The candidate card nearest `card` by datasheet tensor TFLOPS (a profile first on ties)."""
    others = [k for k in candidates if k != card["key"]]
    return min(others, key=lambda k: (abs(math.log(_card(k)["tflops"] / card["tflops"])),
                                      not _card(k)["profile"], CARD_KEYS.index(k)), default=None)


# --- what was measured -----------------------------------------------------------------------

def _used(role: str = "anchor") -> dict[tuple[str, str, str], Published]:
    return {(p.card, p.model, p.path): p for p in PUBLISHED if p.role == role}


ANCHORS = _used()
_FP32 = ANCHORS["h100", "sdxl", "fp32"]
FP32_SHARE = (image_flops("sdxl", _FP32.steps) / _FP32.figure) / PROFILES["h100"].fp32_tflops


def _measured_ratio(path: str) -> dict[tuple[str, str], tuple[float, Published]]:
    """{(card, model): (a path's figure over the same source's "sdpa" one, the figure)}."""
    out = {}
    for (card, model, p_path), p in ANCHORS.items():
        base = ANCHORS.get((card, model, "sdpa"))
        if p_path == path and base is not None and base.source == p.source:
            out[card, model] = (course_seconds(p) / course_seconds(base), p)
    return out


def _borrow(card: dict, model: str, path: str) -> tuple[float, str]:
    """A path's ratio to "sdpa": measured on the card for the model, else the card's for the
    nearest model (by FLOPs), else the nearest card's (by TFLOPS) that measured any."""
    measured = _measured_ratio(path)
    if (card["key"], model) in measured:
        ratio, p = measured[card["key"], model]
        return ratio, f"measured ({p.source}: {p.quote})"
    mine = [m for c, m in measured if c == card["key"]]
    if mine:
        near = min(mine, key=lambda m: abs(math.log(FLOPS[m][0] / FLOPS[model][0])))
        ratio, p = measured[card["key"], near]
        return ratio, f"scaled: {card['key']}'s {near} ({p.source}: {p.quote})"
    other = _nearest(card, {c for c, _ in measured})
    ratio, why = _borrow(_card(other), model, path)
    return ratio, f"scaled: {other}'s, {why}"


def _known_sdpa(card: str) -> set[str]:
    return {m for (c, m, path) in ANCHORS if c == card and path == "sdpa"} | {
        p.model for p in PUBLISHED if p.role == "ratio" and p.card == card and p.path == "sdpa"}


@lru_cache(maxsize=None)
def _sdpa(key: str, model: str) -> tuple[float, str]:
    card = _card(key)
    anchor = ANCHORS.get((key, model, "sdpa"))
    if anchor is not None:
        return course_seconds(anchor), f"measured ({anchor.source}: {anchor.quote})"
    for p in PUBLISHED:
        if p.role == "ratio" and (p.card, p.model, p.path) == (key, model, "sdpa"):
            (other,) = [q for q in PUBLISHED if q.source == p.source and q.model == model
                        and q.path == "sdpa" and (q.card, model, "sdpa") in ANCHORS]
            base, _ = _sdpa(other.card, model)
            return (base * course_seconds(p) / course_seconds(other),
                    f"scaled: {other.card}'s measured figure times {p.source}'s ratio of the "
                    f"two cards ({p.quote} against {other.quote})")
    known = _known_sdpa(key)
    if known:
        if model != "sdxl" and "sdxl" not in known:
            known = {"sdxl"}  # the hub: derived first, the others from it
        source = min(known, key=lambda m: abs(math.log(FLOPS[m][0] / FLOPS[model][0])))
        base, _ = _sdpa(key, source)
        both = [c for c in CARD_KEYS if (c, model, "sdpa") in ANCHORS
                and (c, source, "sdpa") in ANCHORS]
        compiled = [c for c in both if {(c, model), (c, source)} <= _measured_ratio("compiled")
                    .keys()]
        rows = "compiled" if compiled and _gain(card, source)[0] <= COMPUTE_BOUND else "sdpa"
        n = _nearest(card, compiled if rows == "compiled" else both)
        ratio = _row(n, model, rows) / _row(n, source, rows)
        return (base * ratio, f"scaled: {key}'s {source} times {n}'s measured {model}/"
                f"{source} ({rows} rows)")
    n = _nearest(card, {c for (c, _, path) in ANCHORS if path == "sdpa"})
    base, why = _sdpa(n, model)
    return (base * _card(n)["tflops"] / card["tflops"],
            f"scaled: {n}'s estimate times the datasheets' TFLOPS ratio; {n}: {why}")


def _row(card: str, model: str, rows: str) -> float:
    base = course_seconds(ANCHORS[card, model, "sdpa"])
    return base if rows == "sdpa" else base * _measured_ratio("compiled")[card, model][0]


def _gain(card: dict, model: str) -> tuple[float, str]:
    """The compile gain: eager over compiled seconds, never below 1 (never slower)."""
    ratio, how = _borrow(card, model, "compiled")
    return max(1.0 / ratio, 1.0), how


# --- the estimate ----------------------------------------------------------------------------

def path_of(recipe: Recipe) -> str:
    if recipe.compile:
        return "compiled"
    if fp32_or_half(recipe.dtype) == "fp32":
        return "tf32" if recipe.dtype == "tf32" or recipe.tf32 not in (None, "off") else "fp32"
    return "half" if recipe.attention == "classic" else "sdpa"


def _beyond_compile(model: str, recipe: Recipe) -> tuple[float, str]:
    """The steps past compile, as measured: each field's cost key (techniques/recipe.py KNOBS)
    names the two published steps whose ratio prices it, read in the model's own table (the
    blog's A100 for its four models, diffusers-torchao's H100 for Flux); anything else counts
    as the step before."""
    table, source = ((FLUX_H100_SECONDS, "diffusers-torchao's H100 ratio") if model == "flux"
                     else (BLOG_A100_SECONDS.get(model) or {}, "the blog's A100 ratio"))
    factor, said = 1.0, []
    for name, knob in KNOBS.items():
        cost = knob.cost.get(getattr(recipe, name)) if isinstance(knob.cost, dict) else None
        if cost is not None and cost[1] in table and cost[2] in table:
            factor *= table[cost[1]] / table[cost[2]]
            said.append(f"{cost[0]}: {source}")
    return factor, "; ".join(said)


def _rung(model: str, rung: str, ladder: str) -> Recipe:
    if ladder not in LADDERS:
        raise FastdiffError(f"Unknown ladder {ladder!r}: use one of {', '.join(LADDERS)}.")
    steps = dict(LADDERS[ladder])
    if rung not in steps:
        raise FastdiffError(f"{rung!r} is no step of the {ladder} ladder: use one of "
                            f"{', '.join(repr(s) for s in steps)}.")
    return steps[rung]


def estimate(gpu: Any, model: str, path: str, recipe: Recipe | None = None
             ) -> tuple[float, str]:
    """(seconds of one image on `gpu` by `path`, what it rests on) at the native size and the
    course's steps, batch 1."""
    card, key = _card(gpu), _model(model)
    if card["key"] not in CARD_KEYS:  # a card of no profile: the profile nearest in TFLOPS
        near = _nearest(card, PROFILES)
        seconds, why = estimate(near, model, path, recipe)
        return seconds * _card(near)["tflops"] / card["tflops"], f"scaled from {near}: {why}"
    sdpa, why = _sdpa(card["key"], key)
    steps = get_spec(model).steps
    sdpa *= image_flops(key, steps) / image_flops(key, get_spec(key).steps)
    if path == "sdpa":
        return sdpa, why
    if path == "compiled":
        gain, how = _gain(card, key)
        extra, said = _beyond_compile(key, recipe) if recipe else (1.0, "")
        seconds = min(sdpa, sdpa / gain * extra)
        return seconds, f"{why}; compile gain {gain:.2f}x, {how}" + (
            f"; {said}" if said else "")
    half_ratio, how = _borrow(card, key, "half")
    half = sdpa * max(half_ratio, 1.0)
    if path == "half":
        return half, f"{why}; classic attention {max(half_ratio, 1.0):.2f}x, {how}"
    own = ANCHORS.get((card["key"], key, "fp32"))
    floor = (course_seconds(own) if own else
             image_flops(key, steps) * 1e12 / (card["fp32"] * 1e12 * FP32_SHARE))
    if card["capability"] >= (8, 0):
        tf32_ratio, how_tf32 = _borrow(card, key, "tf32")
        tf32 = max(half, sdpa * tf32_ratio)
        if path == "tf32":
            return tf32, f"{why}; TF32 {tf32 / sdpa:.2f}x, {how_tf32}"
    else:
        tf32 = half  # no TF32 before compute capability 8.0: fp32 runs as fp32
    if own:
        return max(floor, tf32), f"measured ({own.source}: {own.quote})"
    return max(floor, tf32), (f"computed: the FLOPs at {card['fp32']:g} FP32 TFLOP/s x "
                              f"{FP32_SHARE:.2f} (the share the H100's measured fp32 SDXL "
                              "reached), never under the card's TF32/half estimate")


def image_seconds(gpu: Any, model: str, rung: str, ladder: str = "course", *,
                  size: int | None = None, batch: int = 1) -> float:
    """Estimated seconds of one call of `model` with ladder step `rung` on `gpu` (a profile key,
    "t4" ... "h200", or a GpuProfile): at the native size and the course's steps, batch 1;
    `size` (square) and `batch` scale it by pixels and images. An estimate from published and
    measured figures (fastdiff_helpers/course/planning/published.py), said by image_basis (docs/
    workshop.md, "The course clock")."""
    seconds, _ = _checked(gpu, model, rung, ladder, size, batch)
    return seconds


def image_basis(gpu: Any, model: str, rung: str, ladder: str = "course") -> str:
    """What image_seconds' figure rests on, in words (measured, scaled or computed)."""
    return _checked(gpu, model, rung, ladder, None, 1)[1]


def _checked(gpu, model, rung, ladder, size, batch) -> tuple[float, str]:
    spec = get_spec(model)
    checks.image_size("size", size, spec.size_multiple)
    checks.whole("batch", batch, 1)
    recipe = _rung(spec.key, rung, ladder)
    seconds, why = estimate(gpu, spec.key, path_of(recipe), recipe)
    pixels = ((size or spec.resolution) / spec.resolution) ** 2
    return seconds * pixels * batch, why


def kind_seconds(gpu: Any, model: str, kind: str) -> float:
    """One image of the course clock's kind of work ("fp32", "half", "compiled";
    models/clock_log.kind) on `gpu`: the rung that runs it (KIND_RUNGS)."""
    ladder = "flux" if _model(model) == "flux" and kind != "fp32" else "course"
    return image_seconds(gpu, model, KIND_RUNGS[ladder][kind], ladder)
