"""`python -m fastdiff_helpers plan --gpu t4`: per notebook, on a card, what runs, what is
swapped or skipped and why, the memory fit, the downloads and the estimated wait, decided by the
functions the notebooks themselves call (course/planning/sizing.py card_fit and rung_verdict,
Recipe's policy, models/fit.py), read from the course clock's record of what each cell does
(course/planning/clock_record.py, with the GPU work of clock_gpu.py). The command's arguments are
parsed in course/runs/cli.py.

Introduced in 00_setup.ipynb (README: preparing a workshop).

What of a notebook runs on a card, cell by cell (card_work): the course clock's record of
each cell's work (course/planning/clock.py cell_work) less what the card skips, so the plan's wait
counts only what runs, and all of it (issue 51). On a card:
- a model that fits in no size in half precision (course/planning/sizing.py card_fit) runs
  nothing: its loads, compiles, frames, benchmarks and calls are left out;
- a compile whose recipe the card refuses (course/planning/sizing.py rung_verdict: fp8 below sm89, a
  peak that does not fit) is left out with its compiled parts' frames, one compiled benchmark
  or call of that model and one load (a ladder step is refused before it loads: models/fit.py
  check_fits, techniques/recipe.py check_device);
- a model whose fp32 does not fit runs its fp32 work in half precision (settings.baseline),
  except in a cell that loads a pipeline for each benchmark (run_ladder's steps), where the
  fp32 step is refused before it loads and costs nothing.
"""

from __future__ import annotations

import json
from typing import Any, Iterable
from functools import lru_cache

from ...errors import FastdiffError
from ...models.dtypes import fp32_or_half
from .gpus import gpu_profile, fits, GpuProfile, PROFILES
from ...techniques.recipe import Recipe
from . import clock
from .clock_record import RECORDED
from .sizing import card_fit, no_fit, rung_verdict
from .course_downloads import course_downloads, for_card

__all__ = ["plan", "plan_table", "plan_summary", "notebooks_by_number", "card_work",
           "compile_fields"]

# --- What of a notebook runs on a card, cell by cell ---------------------------------------------

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


# --- plan --gpu: per notebook, on a card ---------------------------------------------------------

def _work(notebook: str) -> tuple[set[tuple[str, str]], list[tuple[str, dict]]]:
    """The (model, "fp32" | "half") a notebook's cells run, and its compiles (model, recipe)."""
    runs: set[tuple[str, str]] = set()
    compiles: list[tuple[str, dict]] = []
    for _, work in clock.cell_work(notebook):
        for entry in work.get("benchmarks", []) + work.get("calls", []):
            runs.add((entry[0], fp32_or_half(entry[1])))
        for model, mode, *_, rid in work.get("compiles", []):
            fields = compile_fields(model, mode, rid)
            compiles.append((model, fields))
            runs.add((model, fp32_or_half(fields.get("dtype", "fp32"))))
    return runs, compiles


def plan(profile: GpuProfile, notebooks: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One row per notebook: models, "runs" / "swapped" / "skipped" with reasons, the memory
    fit of each model in each precision it runs, and the estimated wait in minutes of what runs
    on the card (card_work): the course clock's estimate with fdh.course.image_seconds on this
    card; compile time as the H100's 16-core host measured it. Introduced in 00_setup.ipynb."""
    names = list(notebooks) if notebooks is not None else list(RECORDED)
    est = clock.estimate(sms=profile.sms, gpu=profile,
                         works={name: card_work(profile, name) for name in names})
    rows = []
    for name in names:
        runs, compiles = _work(name)
        swapped, skipped, notes, fit_cells, fitting = [], [], [], [], 0
        for model, kind in sorted(runs):
            dtype = "fp32" if kind == "fp32" else profile.half
            size = card_fit(profile, model).size
            ok, need = fits(profile, model, dtype, size, size)
            fit_cells.append(f"{model} {dtype} {need.replace('est. ', '')}")
            if not ok:
                why = no_fit(profile, model, dtype, need)
                half_ok, half_need = fits(profile, model, profile.half, size, size)
                if kind == "fp32" and half_ok:
                    ok = True  # the notebook's baseline runs in half precision instead
                    if (model, "half") not in runs:
                        fit_cells.append(f"{model} {profile.half} "
                                         f"{half_need.replace('est. ', '')}")
                    why += (f"; fp32 rungs are skipped, and a notebook's baseline "
                            f"(settings.baseline) runs in {profile.half}")
                skipped.append(why)
            elif kind == "half" and dtype != "bf16":
                swapped.append(f"{model}: bf16 runs as fp16 (inductor compiles no bf16 graph "
                               "below sm80)")
            fitting += ok
        for model, fields in compiles:
            status, _, why = rung_verdict(profile, model, Recipe(**fields))
            if status == "skipped":
                skipped.extend(w.split(". Use")[0] for w in why)
            notes.extend(w for w in why if "is_big_gpu" in w)
        n = est["notebooks"][name]
        minutes = n["total_s"] / 60
        rows.append({"notebook": name, "models": sorted({m for m, _ in runs}),
                     "verdict": "skipped" if runs and not fitting else
                     "partly skipped" if skipped else "swapped" if swapped else "runs",
                     "swapped": sorted(set(swapped)), "skipped": sorted(set(skipped)),
                     "notes": sorted(set(notes)), "fit": fit_cells, "minutes": minutes})
    return rows


def plan_table(gpu: str | None = None, notebooks: Iterable[str] | None = None) -> str:
    """The plan as a Markdown table with its reasons below, for `gpu` (a profile key) or this
    machine's GPU. Introduced in 00_setup.ipynb."""
    profile = gpu_profile(gpu)
    if profile is None:
        raise FastdiffError(f"This machine has no CUDA GPU: name the card to plan for, one of "
                            f"{', '.join(PROFILES)} (--gpu t4).")
    rows = plan(profile, notebooks)
    can = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in profile.can().items())
    lines = [f"Plan for {profile.name}: {profile.gib:.1f} GiB ({profile.total_source}), "
             f"sm{profile.capability[0]}{profile.capability[1]}, {profile.sms} SMs; {can}.",
             "", "| notebook | verdict | est. peak / card (model, dtype) | est. wait (min) |",
             "|---|---|---|---:|"]
    reasons: list[str] = []
    for row in rows:
        marks = []
        for text in row["skipped"] + row["swapped"] + row["notes"]:
            if text not in reasons:
                reasons.append(text)
            marks.append(str(reasons.index(text) + 1))
        mark = f" [{','.join(sorted(set(marks), key=int))}]" if marks else ""
        lines.append(f"| {row['notebook'].removesuffix('.ipynb')} | {row['verdict']}{mark} | "
                     f"{'; '.join(row['fit']) or '-'} | {row['minutes']:.0f} |")
    lines.append(f"| **all** | | | **{sum(r['minutes'] for r in rows):.0f}** |")
    lines += [""] + [f"[{i}] {text}" for i, text in enumerate(reasons, 1)]
    lines += ["", "Estimates: peaks from models/fit.py (weights exact, activations from each "
              "model's measured or published peak, plus a margin); waits of what runs on the "
              "card from the course clock (empty compile cache, autotuning off), images by "
              "fdh.course.image_seconds (published and measured figures, "
              "course/planning/published.py); "
              "compiles timed on a 16-core host (a 2-core host compiles slower)."]
    return "\n".join(lines)


def plan_summary(gpus: Iterable[str] = ("t4", "l4", "a100-40", "h100")) -> str:
    """The course on each card in one row: how many notebooks run as written, run swapped,
    partly skipped or skipped; the estimated wait of all notebooks; the downloads of every
    notebook but 18 (Flux, gated; `download --gpu`). Introduced in 00_setup.ipynb (README, the table it prints)."""
    course = [n for n in RECORDED if n[:2] != "19"]
    lines = [f"| card | runs / swapped / partly skipped / skipped (of {len(RECORDED)}) | est. "
             "wait, all (h) | downloads, all but Flux (GB) |", "|---|---|---:|---:|"]
    for key in gpus:
        profile = PROFILES[key]
        rows = plan(profile)
        counts = [sum(r["verdict"] == v for r in rows)
                  for v in ("runs", "swapped", "partly skipped", "skipped")]
        gb = sum(r[2] for r in for_card(course_downloads(course), profile)[0]) / 1e9
        lines.append(f"| {profile.name} ({profile.gib:.1f} GiB) | "
                     f"{' / '.join(map(str, counts))} | "
                     f"{sum(r['minutes'] for r in rows) / 60:.1f} | {gb:.1f} |")
    return "\n".join(lines)


def notebooks_by_number(numbers: Iterable[str] | None) -> list[str] | None:
    """The recorded notebooks' names for their two-digit `numbers` (`plan --notebooks 00 05`);
    None for None (every notebook)."""
    if numbers is None:
        return None
    by_number = {name[:2]: name for name in RECORDED}
    unknown = [n for n in numbers if n not in by_number]
    if unknown:
        raise FastdiffError(f"--notebooks {' '.join(unknown)}: no such notebook; use "
                            f"numbers from {min(by_number)} to {max(by_number)}.")
    return [by_number[n] for n in numbers]
