"""The reference run: a ladder measured into one results folder, a step at a time, resumable
across short GPU slots (`python3 -m tools.reference`, from the repository root).

Introduced in docs/offline-gpu.md, "On an offline GPU machine" (the course's reference results
are made with it). What run_ladder does in one go, this does in pieces that add up to one ladder:
- it runs only the steps the folder does not hold yet, in ladder order, and after each one
  rewrites results.jsonl (every record, atomically), ladder.png, memory.png and the results
  root's README.md (one table per GPU and model);
- quality is always against the folder's fp32 image (images/0_*.png), whichever process made it;
- the device's dense matmul rate is measured once per folder (reference.json) and every record
  carries it, so each step's achieved TFLOP/s has its share of what the card can do;
- with a budget it never starts a step it expects not to finish (the estimate comes from the
  steps recorded here, or a first guess by step kind), stops at the budget otherwise (the cut
  step leaves no record) and says in one line how to continue (exit code 3);
- tuning is data (course/compiletime/bundle.py): it imports every committed tuning bundle of
  this GPU kind and torch build (results/*/tuning/<torch>/*.json.gz) before the first compile, keeps
  the model's bundle (results/<gpu>/tuning/<torch>/<model>.json.gz) growing while it compiles,
  and measures a compiled step only in a command whose compile tuned nothing: a step that
  tuned is recorded as tuning (its seconds, in the bundle and in reference.json) and measured
  by the next command, which compiles from the data as a bare machine with the bundle would.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from contextlib import nullcontext
from pathlib import Path
from typing import Any


from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.course.planning.published import published_ladder
from fastdiff_helpers.models.hooks import listening
from fastdiff_helpers.models.loading import free_memory
from fastdiff_helpers.techniques import current_recipe
from fastdiff_helpers.models.pretrained import resolve_weights
from fastdiff_helpers.course.planning.autotune import covers, step_blocked
from fastdiff_helpers.course.planning.ladders import LADDERS
from fastdiff_helpers.measure.compile_events import events_between, snapshot, tuned
from fastdiff_helpers.measure.env import device_name
from fastdiff_helpers.course.compiletime.bundle_io import import_matching
from fastdiff_helpers.course.compiletime.watch import TuningWatch
from fastdiff_helpers.measure.quality import compare_images
from fastdiff_helpers.results.charts import Reference, ladder_chart, memory_chart
from fastdiff_helpers.course.reference import RESULTS_FOLDER, save_figure, slug
from .readme import COMMAND, write_results_readme
from fastdiff_helpers.course.runs.ladder import _setup, measure_step, resolve_ladder
from .folder import (baseline_image, matmul_rate, check_same_run, is_compiled, cuts_in_a_row, estimate,
                               record_tuning, results_root, rewrite_results, step_kind, tuning_bundle,
                               Folder)
from fastdiff_helpers.course.compiletime.bundle import gpu_folder
from fastdiff_helpers.measure.record import utc_now
from fastdiff_helpers.course.planning.writes import output_folder

__all__ = ["run_reference", "ReferenceOutcome", "EXIT_BUDGET", "COMMAND"]

EXIT_BUDGET = 3  # stopped at the budget, steps left: run the same command again
CUT_RETRIES = 3  # a step cut at the budget this many times in a row is not started again


class BudgetExceeded(BaseException):
    """Raised by the budget's timer inside a step. A BaseException, so that the per-step
    failure isolation (which records any Exception as a failed step) lets it through."""


class TunedNotMeasured(BaseException):
    """refuse_tuned stopped a step before timing: its compile tuned (`events` say how much;
    `recipe`: what compiled, what its tuning covers); the next command measures it, compiling
    from the tuning data. A BaseException, as BudgetExceeded: not a failed step."""

    def __init__(self, message: str, events: dict[str, Any], recipe: dict | None):
        super().__init__(message)
        self.events, self.recipe = events, recipe


def refuse_tuned(event: str, facts: dict[str, Any]) -> None:
    """A listener (fastdiff_helpers/models/hooks.py) that stops fdh.benchmark before timing
    where its cold start or warm-up tuned (max-autotune benchmarked a GEMM shape or a Triton
    config): the reference run measures a compiled step only in a process whose compile found
    all its tuning in the cache (05_cold_start.ipynb)."""
    if event != "warm":
        return
    spent = {key: sum(e.get(key, 0) for e in facts["events"])
             for key in ("autotunes", "coordesc_benches", "autotune_s")}
    if tuned(spent):
        raise TunedNotMeasured(
            f"the compile tuned ({spent['autotunes']} GEMM/conv shape(s) benchmarked, "
            f"{spent['coordesc_benches']} coordinate-descent config(s) timed): not measured in "
            "this process", spent, current_recipe(facts["pipe"]))


@dataclass
class ReferenceOutcome:
    """What a reference run did: status "complete", "nothing to do" or "budget"; the steps it
    measured, the steps left, and the one line it printed last. exit_code: 0, or EXIT_BUDGET."""

    status: str
    ran: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    message: str = ""
    exit_code: int = 0


def _alarm(seconds: float | None):
    if seconds is None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return

    def stop(signum, frame):
        raise BudgetExceeded()

    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def _continue_line(args_line: str) -> str:
    return f"{COMMAND} {args_line}"


def run_reference(model: str = "sdxl", out: str | Path | None = None, ladder: str | None = None,
                  weights: str = "auto", budget_s: float | None = None, runs: int = 5,
                  warmup: int = 2, steps: int | None = None, height: int | None = None,
                  width: int | None = None, device: str | None = None, seed: int = 0,
                  prompt: str | None = None, retry_failed: bool = False,
                  ignore_estimate: bool = False, progress: bool = True,
                  command: str | None = None, tuning: bool = True,
                  only: list[str] | None = None) -> ReferenceOutcome:
    """Measure the steps of `ladder` that `out` does not hold yet, in order, within `budget_s`
    seconds (None: no budget). `out` is results/<gpu>/<model> (default: that, under the current
    folder, <gpu> from gpu_folder()): the README.md written after each step goes to its
    grandparent results/, the tuning bundle to results/<gpu>/tuning/ (a folder elsewhere keeps
    its bundle itself and gets no README: results_root). A failed step is recorded with its
    error and not run again unless `retry_failed`. `ignore_estimate` starts the next step even when its
    estimate exceeds what is left (it is still stopped at the budget): for a compile cache
    warmed since the last attempt. `command` is how to run this again (for the last line).
    `tuning=False`: no bundle imported or written, and a compiled step that tuned is measured
    anyway (its cold start then includes the tuning). `only`: these steps of the ladder and
    no other, in the order given (a GPU slot measures the steps it has no figure for first);
    when the ladder's first step is measured after others, their quality is filled in from
    their saved images.

    Returns a ReferenceOutcome; the CLI exits with its exit_code (EXIT_BUDGET: steps left)."""
    ladder = resolve_ladder(model, ladder)  # None: the model's own ("flux" for Flux)
    spec, device, _, loading = _setup(model, ladder, device, None, steps, height, width, out)
    if budget_s is not None and budget_s <= 0:
        raise FastdiffError(f"budget_s={budget_s}: give a positive number of seconds, or none "
                            "for no budget.")
    if runs < 1 or warmup < 1:
        raise FastdiffError(f"runs={runs}, warmup={warmup}: the reference run needs at least "
                            "one warm-up (the cold start) and one timed run.")
    weights = resolve_weights(spec, weights, device)
    out = Path(out) if out is not None else Path("results") / gpu_folder(device) / spec.key
    output_folder("out", out, RESULTS_FOLDER, "the reference run")
    root = results_root(out)  # None: out/ keeps everything itself
    folder = Folder(out, ladder)
    here = device_name(device)
    first_record = next(iter(folder.ordered()), None)
    asked = {"model": spec.key, "ladder": ladder, "weights": weights, "device_name": here,
             "height": height or (first_record.height if first_record else None),
             "width": width or (first_record.width if first_record else None),
             "steps": steps or (first_record.steps if first_record else None)}
    asked = {k: v for k, v in asked.items() if v is not None}
    check_same_run(folder, asked)
    again = command or _continue_line(
        f"--model {spec.key} --ladder {ladder} --weights {weights} --out {out}"
        + (f" --budget-s {budget_s:g}" if budget_s else ""))

    unknown = [n for n in only or [] if n not in folder.names]
    if unknown:
        raise FastdiffError(f"--only {', '.join(map(repr, unknown))}: the {ladder} ladder has "
                            f"no such step; its steps are {', '.join(map(repr, folder.names))}.")
    plan = [(i, n, r) for i, (n, r) in enumerate(LADDERS[ladder])
            if n not in folder.records or (retry_failed and folder.records[n].error)]
    if only:
        plan = sorted((p for p in plan if p[1] in only), key=lambda p: only.index(p[1]))
    failed = [n for n, r in folder.records.items() if r.error and n not in [p[1] for p in plan]]
    if not plan:
        message = (f"fastdiff: nothing to do: {out} holds all {len(folder.names)} steps of the "
                   f"{ladder} ladder"
                   + (f" ({len(failed)} failed: {', '.join(failed)}; --retry-failed runs them "
                      "again)" if failed else "") + ".")
        print(message)
        return ReferenceOutcome("nothing to do", message=message)

    baseline = baseline_image(folder)
    folder.state.setdefault("run", {**asked, "runs": runs, "warmup": warmup, "seed": seed})
    interrupted = [a for a in folder.state.get("attempts", []) if a.get("finished") is None]
    for a in interrupted:
        print(f"fastdiff: an earlier run was interrupted during {a['step']!r} (started "
              f"{a['started_at']}); it is measured again.")
        a["finished"] = "interrupted"
    started = time.monotonic()
    print(f"fastdiff: reference run of {spec.key} ({ladder} ladder, {weights} weights) on {here}"
          f" into {out}: {len(plan)} step(s) to go"
          + (f", budget {budget_s:.0f} s" if budget_s else ", no budget"))
    if tuning:
        import_matching(root or out.parent)  # the cache folder is chosen; nothing compiled yet
    bundle = tuning_bundle(out, root, spec.key)
    with TuningWatch(bundle, spec.key, command=again) if tuning else nullcontext() as watch:
        rate = None  # measured (once per folder) just before the first step that runs
        tiny = weights == "tiny"
        ran: list[str] = []
        tuned_now: list[str] = []
        untuned: list[str] = []  # autotuning steps left for a command that may tune
        for n, (idx, name, recipe) in enumerate(plan, start=1):
            left = None if budget_s is None else budget_s - (time.monotonic() - started)
            adapted = recipe.for_device(device)[0]
            compiled = is_compiled(adapted)
            guess, source = estimate(folder, name, compiled, tiny, step_kind(adapted))
            cuts = cuts_in_a_row(folder, name)
            stuck = cuts_in_a_row(folder, name, without_progress=True)
            # The first step of a run has the whole budget (less the setup's second or two). A
            # step cut at the budget before starts again with the whole budget, up to
            # CUT_RETRIES times in a row: the compile cache keeps what the cut attempts compiled
            # (on the H100 each cut max-autotune attempt went on from where the last one stopped).
            retry = (not ran and cuts and stuck < CUT_RETRIES and "stopped unfinished" in source)
            if retry:
                source += (f"; cut {cuts} time(s) at the budget so far, it starts again with the "
                           "whole budget: the compile cache keeps the work of the cut attempts")
            # a cut that tuned kept its tuning (the bundle): only cuts that tuned nothing count
            given_up = stuck >= CUT_RETRIES
            if left is not None and not ignore_estimate and (given_up or (
                    guess > left and not retry and (ran or guess > budget_s))):
                rest = [p[1] for p in plan[n - 1:]]
                if given_up:
                    why = (f"{name!r}: it was cut at the budget {stuck} times in a row without "
                           f"tuning anything new (last after "
                           f"{guess:.0f} s) and needs more than {budget_s:g} s: give a larger "
                           "--budget-s, or warm its compile cache (warm --only, or warm --load a "
                           "file from a machine where it finished) and pass --ignore-estimate")
                elif guess > budget_s:
                    why = (f"{name!r} needs about {guess:.0f} s ({source}), more than the whole "
                           f"budget of {budget_s:.0f} s: give a larger --budget-s, or warm its "
                           "compile cache first (warm --only) and pass --ignore-estimate")
                else:
                    why = (f"{name!r} needs about {guess:.0f} s ({source}) and {left:.0f} s of the "
                           "budget are left")
                message = (f"fastdiff: stopped before {why}. {len(ran)} step(s) measured now, "
                           f"{len(rest)} left. Continue with: {again}")
                print(message)
                return ReferenceOutcome("budget", ran, rest, message, EXIT_BUDGET)
            reason = step_blocked(LADDERS[ladder][idx - 1][1] if idx else None, recipe,
                                  device, spec.key, weights)
            if reason is not None:  # no record: a command with --autotune measures it
                print(f"fastdiff: {name!r} left for later: {reason}")
                untuned.append(name)
                continue
            if rate is None:
                out.mkdir(parents=True, exist_ok=True)
                rate = matmul_rate(folder, device)
            print(f"[{n}/{len(plan)}] {spec.key} {name} (about {guess:.0f} s: {source})")
            attempt = {"step": name, "compiled": compiled, "started_at": utc_now(), "finished": None,
                       "seconds": None}
            folder.state.setdefault("attempts", []).append(attempt)
            folder.save_state()
            step_started = time.monotonic()
            before = snapshot()
            try:
                _alarm(left)
                with listening(refuse_tuned) if tuning and compiled else nullcontext():
                    result = measure_step(
                        spec, name, recipe, weights, device, loading, baseline, steps=steps,
                        height=height, width=width, runs=runs, warmup=warmup, seed=seed,
                        prompt=prompt, progress=progress)
                _alarm(None)
            except TunedNotMeasured as exc:
                _alarm(None)
                record_tuning(folder, watch, attempt, name, exc.events, step_started,
                              covers=covers(spec.key, weights, exc.recipe))
                print(f"   {name}: {exc}, in {attempt['seconds']:.0f} s; the next command "
                      "compiles it from the tuning data and measures it")
                tuned_now.append(name)
                continue
            except BudgetExceeded:
                _alarm(None)
                events = events_between(before, snapshot())
                record_tuning(folder, watch, attempt, name, events, step_started, False)
                free_memory()
                rest = [p[1] for p in plan[n - 1:]]
                message = (f"fastdiff: stopped at the budget ({budget_s:g} s) during {name!r} "
                           f"after {attempt['seconds']:.0f} s; it left no record"
                           + (f" (its tuning so far is kept: {events['autotunes']} shape(s), "
                              f"{events['coordesc_benches']} descent config(s))"
                              if tuned(events) else "")
                           + f". {len(ran)} step(s) measured now, {len(rest)} left. Continue "
                           f"with: {again}")
                print(message)
                return ReferenceOutcome("budget", ran, rest, message, EXIT_BUDGET)
            if watch is not None and compiled:
                watch.note_step(name, time.monotonic() - step_started,
                                events_between(before, snapshot()), "measured",
                                covers=covers(spec.key, weights, result.recipe)
                                if result.error is None else [])
            attempt.update(finished=result.error is None,
                           seconds=round(time.monotonic() - step_started, 1))
            if result.error is not None:
                attempt["finished"] = "failed"
            result.matmul_tflops = rate
            if result.error is None:
                if idx == 0:
                    baseline = result.image
                    result.quality = compare_images(result.image, baseline)
                    fill_quality(folder, baseline)
                elif baseline is None:
                    result.notes.append(f"no quality figure: the folder has no {folder.names[0]} "
                                        "image to compare with (that step failed, or is not "
                                        "measured yet: measuring it fills this in)")
                    result.quality = None
                image_path = out / "images" / f"{idx}_{slug(name)}.png"
                image_path.parent.mkdir(parents=True, exist_ok=True)
                result.image.save(image_path)
                result.image_path = image_path.relative_to(out).as_posix()
            folder.records[name] = result
            rewrite_results(folder.ordered(), out / "results.jsonl")
            folder.save_state()
            draw(folder, spec.key, weights)
            if root is not None:
                write_results_readme(root)
            print("   " + result.summary()
                  + (f", {result.tflops_per_s:.3g} TFLOP/s = {result.matmul_share:.1%} of the "
                     f"measured matmul rate" if result.matmul_share else ""))
            for note in result.notes:
                print("     note: " + note)
            ran.append(name)

        left_steps = [n for n in folder.names if n not in folder.records]
        if tuned_now:
            message = (f"fastdiff: {len(tuned_now)} compiled step(s) tuned now and not measured"
                       f" ({', '.join(tuned_now)}); {len(ran)} step(s) measured now, "
                       f"{len(left_steps)} left. Continue with: {again}")
            print(message)
            return ReferenceOutcome("tuned", ran, left_steps, message, EXIT_BUDGET)
        table = f"; table in {root / 'README.md'}." if root else "."
        if untuned:
            message = (f"fastdiff: {out} holds {len(folder.records)} of the "
                       f"{len(folder.names)} steps of the {ladder} ladder ({len(ran)} measured "
                       f"now); left for a command with --autotune: {', '.join(untuned)}{table}")
            print(message)
            return ReferenceOutcome("complete", ran, left_steps, message)
        if left_steps:  # --only left these out
            message = (f"fastdiff: {out} holds {len(folder.records)} of the {len(folder.names)} "
                       f"steps of the {ladder} ladder ({len(ran)} measured now); not asked for: "
                       f"{', '.join(left_steps)}{table}")
        else:
            message = (f"fastdiff: {out} holds all {len(folder.names)} steps of the {ladder} "
                       f"ladder ({len(ran)} measured now){table}")
        print(message)
        return ReferenceOutcome("complete", ran, left_steps, message)


def fill_quality(folder: Folder, baseline) -> None:
    """Quality, against the fp32 image just measured, of the records made before it (--only
    ran them first): each from its saved image, as the slow test checks every record's."""
    from PIL import Image

    for record in folder.records.values():
        if (record.error is None and record.quality is None and record.image_path
                and (folder.out / record.image_path).exists()):  # only 0_* is committed
            with Image.open(folder.out / record.image_path) as image:
                record.quality = compare_images(image.convert("RGB"), baseline)
            record.notes = [n for n in record.notes if not n.startswith("no quality figure")]
            record.notes.append(f"quality filled in when {folder.names[0]!r} was measured "
                                "after this step (from its saved image)")


def draw(folder: Folder, model: str, weights: str) -> None:
    """ladder.png (with the published bars, the blog's A100 row or diffusers-torchao's H100
    Flux figures, for its ladder on real-size weights) and
    memory.png of the folder's records."""
    records = folder.ordered()
    reference, published = None, published_ladder(model, folder.ladder)
    if weights != "tiny" and published is not None:
        reference = Reference("Published", *published)
    save_figure(ladder_chart(records, reference=reference), folder.out / "ladder.png")
    save_figure(memory_chart(records), folder.out / "memory.png")
