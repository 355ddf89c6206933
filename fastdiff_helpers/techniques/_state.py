"""Shared bookkeeping for the techniques: what was applied, and refusals that keep it sane."""

from __future__ import annotations

from typing import Any

from ..models.loading import get_denoiser, pipeline_info
from .recipe import RecipeError


def applied(pipe) -> dict[str, Any]:
    return pipeline_info(pipe)["applied"]


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


def modules(pipe):
    """The modules the techniques change: the denoiser and the VAE."""
    return [get_denoiser(pipe), pipe.vae]

