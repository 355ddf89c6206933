"""`python -m fastdiff_helpers plan [--gpu KEY] [--notebooks NN ...] [--summary]`: the plan
command's arguments parsed, and the plan printed; the plan itself is course/planning/plan.py.

Introduced in 00_setup.ipynb (README: preparing a workshop)."""

from __future__ import annotations

from ...models.gpus import PROFILES
from ..planning.plan import notebooks_by_number, plan_summary, plan_table

__all__ = ["add_plan_command", "run_plan"]


def add_plan_command(sub) -> None:
    """`plan [--gpu KEY] [--notebooks NN ...]` on the command line."""
    cmd = sub.add_parser("plan", help="per notebook, on a card: what runs, what is swapped or "
                         "skipped and why, memory fit and the estimated wait")
    cmd.add_argument("--gpu", choices=list(PROFILES), default=None,
                     help="the card to plan for (default: this machine's GPU)")
    cmd.add_argument("--notebooks", nargs="+", default=None, metavar="NN",
                     help="only these notebooks, by number (00 05 ...)")
    cmd.add_argument("--summary", action="store_true",
                     help="one row per workshop card (T4, L4, A100 40GB, H100): the README's table")


def run_plan(args) -> int:
    if args.summary:
        print(plan_summary())
        return 0
    print(plan_table(args.gpu, notebooks_by_number(args.notebooks)))
    return 0
