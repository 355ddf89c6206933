"""Shared bookkeeping for the techniques: what was applied, and refusals that keep it sane."""

from __future__ import annotations

from typing import Any

from ..models.loading import get_denoiser, pipeline_info, pipeline_spec
from .recipe import RecipeError


def applied(pipe) -> dict[str, Any]:
    return pipeline_info(pipe).applied


def record(pipe, name: str, value: Any) -> None:
    applied(pipe)[name] = value


def refuse_after(pipe, technique: str, *earlier: str) -> None:
    """Refuse `technique` once any of `earlier` was applied (they must come after it)."""
    done = applied(pipe)
    for name in earlier:
        if name in done:
            raise RecipeError(f"{technique} must come before {name}, which this pipeline already "
                              f"has. Load a fresh pipeline and apply {technique} first "
                              "(fdh.apply orders the techniques for you).")


def parts(pipe) -> dict[str, Any]:
    """The parts the techniques change, by name: the denoiser ("unet" or "transformer") and the
    VAE."""
    return {pipeline_spec(pipe).denoiser: get_denoiser(pipe), "vae": pipe.vae}


# --- reading a pipeline back (fdh.current_recipe) ---------------------------------------------

def agree(found: dict[str, set | None], order: tuple, prefer: Any = None) -> Any:
    """The one value every part is consistent with: `found` holds, per part, the values its
    modules are consistent with (None: nothing there that tells). Among several, `prefer` (what
    the helpers recorded) if it is one of them, else the first of `order`; `order[0]` where no
    part tells. Parts that disagree are read as what each is, "unet: True, vae: False" (a value
    no Recipe takes: a technique applied to some of the parts it changes is not that technique)."""
    told = {part: values for part, values in found.items() if values is not None}
    common = set(order) if not told else set.intersection(*map(set, told.values()))
    if common:
        return prefer if prefer in common else next(v for v in order if v in common)
    return ", ".join(f"{part}: {'/'.join(str(v) for v in order if v in values) or 'mixed'}"
                     for part, values in told.items())


def consistent(values: list[set]) -> set | None:
    """What all of a part's modules are consistent with (None: no module tells)."""
    return set.intersection(*values) if values else None
