"""This process's tuning state in one object, STATE, with one reset: the autotuning switch,
what imported bundles cover and which came from another GPU kind, what each model's bundle
brought into the cache, the watches that torch's hooks report to, and the folders whose
bundles were imported. Introduced in 05_cold_start.ipynb and 13_autotuning.ipynb.

Here, below compiletime and course, so that every module that keeps part of it may import it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = ["TuningState", "STATE", "coverage_key", "cover", "covered_by", "seed",
           "seeded_from"]


@dataclasses.dataclass
class TuningState:
    """What this process switched on or imported; reset() forgets all of it (a test aid, and a
    fresh start)."""
    # set_autotune's choice ({"on": bool}; empty: the environment decides)
    switch: dict[str, bool] = dataclasses.field(default_factory=dict)
    # coverage key -> where it came from (a bundle's path): what imported bundles hold finished
    covered: dict[str, str] = dataclasses.field(default_factory=dict)
    # tuning imported from another GPU kind of one design (course/compiletime/bundle.py), by model
    # (None: a bundle of no model): [{"gpu_name", "source"}]
    seeded: dict[str | None, list[dict[str, str]]] = dataclasses.field(default_factory=dict)
    # (op, input key, precision) / best config path / single key -> (model, value) of what
    # import_tuning brought in: export_tuning for another model leaves those out while unchanged
    imported: dict[tuple[str, str, str], tuple[str | None, Any]] = dataclasses.field(
        default_factory=dict)
    imported_best: dict[str, tuple[str | None, Any]] = dataclasses.field(default_factory=dict)
    imported_local: dict[str, tuple[str | None, Any]] = dataclasses.field(default_factory=dict)
    watches: list[Any] = dataclasses.field(default_factory=list)  # the hooks report to the last
    roots: set[str] = dataclasses.field(default_factory=set)  # import_course_tuning's folders

    def reset(self) -> None:
        for field in dataclasses.fields(self):
            getattr(self, field.name).clear()


STATE = TuningState()


def coverage_key(model: str, weights: str, recipe: dict, part: str) -> str:
    """One compiled part (denoiser or vae) of one recipe on one model: the full-size
    architectures share their kernels whatever the weights; the tiny ones are another model."""
    return json.dumps({"model": model, "size": "tiny" if weights == "tiny" else "full",
                       "recipe": recipe, "part": part}, sort_keys=True, default=str)


def cover(key: str, source: str) -> None:
    """Note that `source` (a bundle) holds the finished tuning of `key` (coverage_key)."""
    STATE.covered.setdefault(key, source)


def covered_by(model: str, weights: str, recipe: Any) -> str | None:
    """The bundle that covers every part this recipe (a Recipe) compiles, or None."""
    parts = ["denoiser"] + (["vae"] if recipe.compile_vae else [])
    sources = [STATE.covered.get(coverage_key(model, weights, recipe.to_dict(), p))
               for p in parts]
    return sources[0] if all(sources) else None


def seed(model: str | None, gpu_name: str, source: str) -> None:
    """Note that `source`, tuned on `gpu_name`, was imported on this GPU (explicitly)."""
    entry = {"gpu_name": gpu_name, "source": source}
    if entry not in STATE.seeded.setdefault(model, []):
        STATE.seeded[model].append(entry)


def seeded_from(model: str | None = None) -> list[dict[str, str]]:
    """The imports from another GPU kind that tuning of `model` may read (its own and those of
    no model), or every one with model None."""
    if model is None:
        return [e for entries in STATE.seeded.values() for e in entries]
    return STATE.seeded.get(model, []) + STATE.seeded.get(None, [])
