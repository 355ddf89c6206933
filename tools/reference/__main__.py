"""`python3 -m tools.reference`: measure a ladder into results/<gpu>/<model>, the steps not yet
recorded there, within a time budget (resumable). The flags the package's `ladder` command
takes (fastdiff_helpers/course/runs/cli.py), and the run's own."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

from fastdiff_helpers import checks
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.course.planning.autotune import set_autotune
from fastdiff_helpers.course.planning.ladders import LADDERS
from fastdiff_helpers.course.parameters import course_hooks
from fastdiff_helpers.course.runs.cli import (CLI_NAMES, INPUT_ERRORS, _check_counts, _common,
                                              _Parser, refused)
from fastdiff_helpers.course.runs.ladder import resolve_ladder

from .run import COMMAND, run_reference


def build_parser() -> argparse.ArgumentParser:
    ref = _Parser(prog=COMMAND, description="measure a ladder into results/<gpu>/<model>, the "
                  "steps not yet recorded there, within a time budget (resumable)")
    _common(ref)
    ref.add_argument("--ladder", default=None, choices=sorted(LADDERS),
                     help="default: the model's own (blog, or flux for Flux)")
    ref.add_argument("--out", default=None, metavar="DIR",
                     help="default results/<gpu>/<model> (e.g. results/h100-80gb-hbm3/sdxl): "
                          "records, images, charts; results/README.md is rewritten after each "
                          "step; the tuning bundle grows in results/<gpu>/tuning/<torch>/ (a "
                          "DIR not under a folder named results keeps its bundle in "
                          "DIR/tuning/ and gets no README)")
    ref.add_argument("--budget-s", type=float, default=None,
                     help="stop before a step that would not finish in what is left of this "
                          "many seconds, or at the budget (the cut step leaves no record; exit "
                          "code 3 says: run again)")
    ref.add_argument("--retry-failed", action="store_true", help="run failed steps again")
    ref.add_argument("--ignore-estimate", action="store_true",
                     help="start the next step even if its estimate exceeds the budget left "
                          "(its compile cache was warmed since); it still stops at the budget")
    ref.add_argument("--no-tuning", action="store_true",
                     help="neither import nor write tuning bundles, and measure a compiled "
                          "step even when its compile tuned")
    ref.add_argument("--only", action="append", default=None, metavar="STEP",
                     help="measure this step of the ladder (repeat for more, in the order "
                          "given) and no other; a later --only of the first step fills in the "
                          "others' quality")
    return ref


def main(argv: Sequence[str] | None = None) -> int:
    """Run it; returns the exit code (0 done, 2 invalid input, 3 stopped at the budget)."""
    with checks.command_line(CLI_NAMES):  # messages name --flags, not Python arguments
        try:
            args = build_parser().parse_args(argv)
            course_hooks()  # as the package's command line: the clock's recorder, the weights
            _check_counts(args)
            if args.budget_s is not None and args.budget_s <= 0:
                raise FastdiffError(f"--budget-s must be a positive number of seconds, got "
                                    f"{args.budget_s:g}")
            if args.autotune:
                set_autotune(True)  # this process's compiles may tune
            args.ladder = resolve_ladder(args.model, args.ladder)  # refused before any work
            words = list(argv) if argv is not None else sys.argv[1:]
            outcome = run_reference(
                model=args.model, out=args.out, ladder=args.ladder, weights=args.weights,
                budget_s=args.budget_s, runs=args.runs, warmup=args.warmup, steps=args.steps,
                height=args.height, width=args.width, device=args.device, seed=args.seed,
                prompt=args.prompt, retry_failed=args.retry_failed,
                ignore_estimate=args.ignore_estimate, progress=not args.no_progress,
                command=f"{COMMAND} " + shlex.join(words), tuning=not args.no_tuning,
                only=args.only)
            return outcome.exit_code
        except INPUT_ERRORS as exc:
            return refused(exc)


if __name__ == "__main__":
    sys.exit(main())
