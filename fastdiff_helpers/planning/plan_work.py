"""What of a notebook runs on a card, cell by cell: the course clock's record of each cell's
work (planning/clock.py cell_work) less what the card skips, so the plan's wait counts only
what runs, and all of it (issue 51).

Introduced in 00_setup.ipynb (`python -m fastdiff_helpers plan`). On a card:
- a model that fits in no size in half precision (planning/sizing.py card_fit) runs nothing: its
  loads, compiles, frames, benchmarks and calls are left out;
- a compile whose recipe the card refuses (planning/sizing.py rung_verdict: fp8 below sm89, a
  peak that does not fit) is left out with its compiled parts' frames, one compiled benchmark
  or call of that model and one load (a ladder step is refused before it loads: models/fit.py
  check_fits, techniques/recipe.py check_device);
- a model whose fp32 does not fit runs its fp32 work in half precision (settings.baseline),
  except in a cell that loads a pipeline for each benchmark (run_ladder's steps), where the
  fp32 step is refused before it loads and costs nothing.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from . import clock
from .sizing import card_fit, rung_verdict
from ..models.gpus import GpuProfile
from ..techniques.recipe import Recipe

__all__ = ["card_work", "compile_fields"]


def compile_fields(model: str, mode: str, rid: str) -> dict[str, Any]:
    """A recorded compile's recipe fields. A compile outside fdh.apply (fdh.compile_pipeline)
    records no recipe: the course compiles its half-precision pipelines so."""
    fields = (json.loads(rid) if rid != "compile_pipeline"
              else {"dtype": "bf16", "attention": "sdpa", "compile": mode})
    if str(fields.get("quant_filter", "")).startswith("callable:"):
        fields.pop("quant_filter")  # the filter does not change what a card can run
    return fields


@lru_cache(maxsize=None)
def _fit(profile: GpuProfile, model: str) -> tuple[bool, bool]:
    """(runs at some size in half precision, its fp32 fits too)."""
    fit = card_fit(profile, model)
    return fit.size is not None, fit.size is not None and fit.fp32_fits


def _refused(profile: GpuProfile, model: str, mode: str, rid: str) -> bool:
    recipe = Recipe(**compile_fields(model, mode, rid))
    return rung_verdict(profile, model, recipe)[0] == "skipped"


def _drop_one(entries: list, model: str, kind: str) -> None:
    for i, entry in enumerate(entries):
        if entry[0] == model and entry[1] == kind:
            del entries[i]
            return


def _on_card(profile: GpuProfile, work: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(work))  # the record's own lists stay as they are
    loads, benches, calls = (out.setdefault(k, []) for k in ("loads", "benchmarks", "calls"))
    named = set(loads) | {e[0] for e in benches + calls + out.get("compiles", [])}
    runs = {m for m in named if _fit(profile, m)[0]}
    if named and not runs:
        out["frames"] = 0  # recompiles of a pipeline this card never loads
    kept = []
    for entry in out.get("compiles", []):
        model, mode, _, vae, _, rid = entry
        if model in runs and not _refused(profile, model, mode, rid):
            kept.append(entry)
            continue
        out["frames"] = max(out.get("frames", 0) - 1 - int(vae), 0)
        compiled = [b for b in benches if b[:2] == [model, "compiled"]]
        _drop_one(benches if compiled else calls, model, "compiled")
        if model in loads:
            loads.remove(model)
    out["compiles"] = kept
    ladder = {m: loads.count(m) >= sum(b[0] == m for b in benches) > 0 for m in runs}
    for entries in (benches, calls):
        for entry in list(entries):
            model, kind = entry[0], entry[1]
            if model not in runs:
                entries.remove(entry)
            elif kind == "fp32" and not _fit(profile, model)[1]:
                if ladder[model] and entries is benches:
                    entries.remove(entry)  # the ladder's fp32 step: refused before it loads
                    loads.remove(model)
                else:
                    entry[1] = "half"  # the notebook's baseline in half precision
    out["loads"] = [m for m in loads if m in runs]
    return out


def card_work(profile: GpuProfile, notebook: str) -> list[tuple[str, dict[str, Any]]]:
    """(cell, the work it does on this card) in notebook order: the clock's record with what
    the card skips left out (the module's docstring says how)."""
    return [(cell, _on_card(profile, work)) for cell, work in clock.cell_work(notebook)]
