"""A reference run's folder (results/<gpu>/<model>): its records by step, its state file
(reference.json: the run's settings, the matmul rate, every attempt), the fp32 image every
quality figure is measured against, and what a step is expected to take.

Used by run.py. Introduced in docs/offline-gpu.md, "On an offline GPU machine".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fastdiff_helpers import checks
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.course.planning.ladders import LADDERS
from fastdiff_helpers.measure.env import device_name
from fastdiff_helpers.measure.record import utc_now
from fastdiff_helpers.measure.flops import measure_matmul_tflops
from .readme import STATE, check_results_readme
from fastdiff_helpers.results.store import RESULTS_FILE, Result, is_results_file, load_results
from fastdiff_helpers.course.planning.writes import write_atomic

# A first guess of one step's wall time (load, apply, compile, warm-ups, timed runs) when the
# folder records nothing of that kind yet: (tiny weights?, kind) -> seconds, kind "eager",
# "compiled" (default or reduce-overhead mode: nothing tuned) or "tuned" (a compile that may
# autotune). Tiny: the 2-core CPU machine took 5-20 s an eager step and 60-120 s a compiled one.
# Full size: SDXL on the H100 took 25-45 s an eager step (results/h100-80gb-hbm3/sdxl); its
# first compiled step in reduce-overhead mode took 142.8 s on the H200, 110.8 s of it
# compiling (results/h200/slot-2026-11-29.md); its first max-autotune call did not finish in
# 540 s (gpu-tests.md), so a tuning compile's guess is that.
FIRST_GUESS_S = {(True, "eager"): 30.0, (True, "compiled"): 150.0, (True, "tuned"): 150.0,
                 (False, "eager"): 120.0, (False, "compiled"): 180.0, (False, "tuned"): 540.0}


def step_kind(recipe) -> str:
    """"eager", "compiled" (nothing tuned) or "tuned": how this process compiles `recipe`
    (autotuning is on only where asked: course/planning/autotune.py)."""
    if recipe.compile is None:
        return "eager"
    from fastdiff_helpers.course.planning.autotune import autotune_enabled, tunes

    return "tuned" if autotune_enabled() and tunes(recipe.compile, recipe.inductor_flags) \
        else "compiled"


def results_root(out: Path) -> Path | None:
    """Where a folder out = results/<gpu>/<model> keeps its table and its tuning: results/,
    the grandparent, when it is named "results" (the layout the reference run keeps), with a
    README.md that is new or the reference run's own (any other is refused before any work).
    Elsewhere None: the folder keeps its tuning bundle itself (out/tuning/<torch>/) and no
    README table is written, so nothing lands outside the folder given."""
    if out.absolute().parent.parent.name != "results":
        return None
    root = out.parent.parent
    check_results_readme(root)
    return root


def tuning_bundle(out: Path, root: Path | None, model: str) -> Path:
    """The model's tuning bundle: results/<gpu>/tuning/<torch>/, or in the folder itself."""
    import torch

    return (out.parent if root else out) / "tuning" / torch.__version__ / f"{model}.json.gz"


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def rewrite_results(results: list[Result], path: Path) -> Path:
    """Replace a results.jsonl with exactly these records, whole or not at all (write_atomic):
    how the reference run keeps its steps in the ladder's order."""
    path = checks.output_file("path", path, ours=is_results_file, what=RESULTS_FILE)
    write_atomic(path, "".join(json.dumps(r.to_dict(), sort_keys=True, allow_nan=False) + "\n"
                               for r in results))
    return path


def is_compiled(recipe) -> bool:
    return recipe.compile is not None


class Folder:
    """One results folder: its records (by step), its state file, its images."""

    def __init__(self, out: Path, ladder: str):
        self.out, self.ladder = out, ladder
        self.names = [n for n, _ in LADDERS[ladder]]
        self.state_path = out / STATE
        self.state: dict[str, Any] = (json.loads(self.state_path.read_text())
                                      if self.state_path.exists() else {})
        store = out / "results.jsonl"
        self.records: dict[str, Result] = {}
        if store.exists():
            for r in load_results(store):
                if r.step not in self.names:
                    raise FastdiffError(
                        f"{store} holds a step {r.step!r} that the {ladder} ladder does not "
                        f"have ({', '.join(self.names)}): is it a {other(ladder)} ladder "
                        f"folder? Pass --ladder {other(ladder)}, or use another --out.")
                self.records[r.step] = r  # a later record of a step replaces an earlier one

    def ordered(self) -> list[Result]:
        return [self.records[n] for n in self.names if n in self.records]

    def save_state(self) -> None:
        write_json(self.state_path, self.state)


def other(ladder: str) -> str:
    return next((name for name in LADDERS if name != ladder), ladder)


def check_same_run(folder: Folder, asked: dict[str, Any]) -> None:
    """Refuse, before any work, to add steps measured another way to a folder."""
    held = folder.state.get("run")
    if held is None and folder.records:  # a folder written by `ladder --out`: read its records
        first = folder.ordered()[0]
        held = {"model": first.model, "weights": first.weights, "height": first.height,
                "width": first.width, "steps": first.steps, "device_name": first.device_name,
                "ladder": folder.ladder}
    if held is None:
        return
    different = {k: (held.get(k), v) for k, v in asked.items()
                 if k in held and held.get(k) != v}
    if different:
        said = ", ".join(f"{k}: folder {h!r}, now {v!r}" for k, (h, v) in different.items())
        raise FastdiffError(
            f"{folder.out} holds a run measured differently ({said}). A folder holds one "
            "ladder of one model on one GPU: pass the folder's settings, or use another --out "
            "(results/<gpu>/<model>).")


def baseline_image(folder: Folder):
    """The folder's fp32 image (the ladder's first step), or None before it is measured."""
    first = folder.records.get(folder.names[0])
    if first is None or first.error is not None:
        return None
    if not first.image_path or not (folder.out / first.image_path).exists():
        raise FastdiffError(
            f"{folder.out}: the {first.step} record has no image at "
            f"{folder.out / (first.image_path or 'images/0_*.png')}, and every quality figure "
            "is measured against it. Restore the image, or remove that record from "
            "results.jsonl to measure the baseline again.")
    from PIL import Image
    with Image.open(folder.out / first.image_path) as image:
        return image.convert("RGB")


def estimate(folder: Folder, name: str, compiled: bool, tiny: bool,
             kind: str | None = None) -> tuple[float, str]:
    """Expected wall seconds of a step, and where the figure comes from (`kind`: step_kind's,
    for the first guess; default "compiled" or "eager" as `compiled` says)."""
    attempts = folder.state.get("attempts", [])
    done = [a["seconds"] for a in attempts
            if a.get("finished") is True and a.get("compiled") == compiled and a.get("seconds")]
    done += [r.wall_s for r in folder.records.values()
             if r.wall_s and compiled_record(r) == compiled]
    recorded = "compiled" if compiled else "eager"
    if done:
        seconds, source = max(done), f"the longest {recorded} step recorded here"
    else:
        first = kind or recorded
        seconds = FIRST_GUESS_S[(tiny, first)]
        source = (f"a first guess for {'an' if first == 'eager' else 'a'} "
                  f"{'compiled step that may tune' if first == 'tuned' else first + ' step'} "
                  f"({'tiny' if tiny else 'full-size'} weights)")
    cut = [a["seconds"] for a in attempts
           if a.get("step") == name and a.get("finished") is False and a.get("seconds")]
    if cut and max(cut) > seconds:
        seconds, source = max(cut), "its last attempt, stopped unfinished after that long"
    return seconds, source


def cuts_in_a_row(folder: Folder, name: str, without_progress: bool = False) -> int:
    """How many times in a row, up to now, `name` was stopped at the budget unfinished (with
    `without_progress`: only the cuts that tuned nothing count; a cut that tuned kept its work
    in the bundle, and a run that tuned before the cut counts as one too)."""
    count = 0
    for a in reversed([a for a in folder.state.get("attempts", []) if a.get("step") == name]):
        if a.get("finished") is False:
            if without_progress and (a.get("autotunes") or a.get("coordesc_benches")):
                break
            count += 1
        elif a.get("finished") == "tuned" and without_progress:
            break
        elif a.get("finished") not in ("interrupted", "tuned"):
            break
    return count


def record_tuning(folder: Folder, watch, attempt: dict, name: str, events: dict,
                  step_started: float, finished: Any = "tuned", covers: list | None = None
                  ) -> None:
    """Record an attempt that tuned (finished "tuned") or was cut at the budget (False): its
    seconds and tuning counters, in reference.json and in the tuning bundle's run record
    (with what a finished one covers: course/planning/autotune.py covers)."""
    import time

    seconds = round(time.monotonic() - step_started, 1)
    attempt.update(finished=finished, seconds=seconds, autotunes=events["autotunes"],
                   coordesc_benches=events["coordesc_benches"])
    folder.save_state()
    if watch is not None:
        watch.note_step(name, seconds, events, "tuned" if finished == "tuned" else "cut",
                        covers=(covers or []) if finished == "tuned" else [])
        watch.flush("running")


def compiled_record(r: Result) -> bool:
    return bool((r.recipe or {}).get("compile"))


def matmul_rate(folder: Folder, device: str) -> float:
    """The device's dense matmul rate, measured once per folder (reference.json)."""
    held = folder.state.get("matmul")
    name = device_name(device)
    if held and held.get("device_name") == name:
        return float(held["tflops"])
    is_cuda = torch.device(device).type == "cuda"
    rate = measure_matmul_tflops(device)
    folder.state["matmul"] = {
        "tflops": rate, "device_name": name, "measured_at": utc_now(),
        "what": ("bf16 8192x8192 @ 8192x8192, 20 products after 3 warm-ups, CUDA events"
                 if is_cuda else "fp32 1024x1024 @ 1024x1024, 5 products, perf_counter")}
    folder.save_state()
    print(f"fastdiff: dense matmul rate of {name}: {rate:.3g} TFLOP/s "
          f"({'bf16' if is_cuda else 'fp32'}, measured once for this folder)")
    return rate
