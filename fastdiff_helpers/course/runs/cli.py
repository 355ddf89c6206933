"""The command line: `python -m fastdiff_helpers demo | ladder | bench | batch | warm | tuning
| download | env | plan` (also `fastdiff ...`); warm, tuning and clock are in
cli_compile.py. `download` fetches the weights the course (or the notebooks named) loads ahead
of a workshop, in the dtypes its cells run them in, sizes said first and the disk checked: each
repository by huggingface_hub's own snapshot_download (its progress bars), restricted to the
files from_pretrained loads in that dtype (allow_patterns, below), the configs,
tokenizers and scheduler beside them. `plan` prints course/planning/plan.py's plan.

Introduced in 00_setup.ipynb (env) and 17_all_models.ipynb (ladder). The CLI only composes
the package's functions; invalid input prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ...errors import FastdiffError
from ... import checks
from ...models.downloads import GB, check_disk, repo_folders, wanted_variant
from ..planning.gpus import PROFILES, gpu_profile
from ...models.hub import (cached, check_cache_folder, fetch, file_sizes, gate_todo, offline,
                          weight_files,
                          hub_errors, needs_access)
from ...models.loading import default_device, load_pipeline
from ...models.noise import quiet_known_noise
from ...models.presets import DEFAULT_PROMPT, MODELS, SCHEDULERS, VAES, size_multiple
from ...models.pretrained import WEIGHTS, resolve_weights
from ...techniques import apply
from ..planning.autotune import course_tuning, set_autotune
from ...techniques.recipe import RecipeError
from ..planning.ladders import LADDERS
from ..planning.course_downloads import course_downloads, for_card, table
from ..planning.plan import notebooks_by_number, plan_summary, plan_table
from ...measure.bench import benchmark
from ...measure.env import env_report
from ..reference import RESULTS_FOLDER, save_result
from ...results.tables import format_table
from ..parameters import course_hooks, smoke_mode
from . import demo
from .ladder import resolve_ladder, run_ladder
from .launch import add_recipe_flags, batch_from_args, recipe_from_args
from .cli_compile import COMPILE_COMMANDS, UsageError, add_compile_commands
from ..planning.writes import output_folder

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage block and exit
        raise UsageError(message)


LADDER_HELP = ("blog: the blog's recipe on today's stack; course: the course's own; flux: the "
               "course's Flux ladder (default: the model's own, blog or flux)")
LADDER_COMMANDS = ("demo", "ladder", "warm")
# the Python argument names whose flag is another word (checks.arg writes them in messages)
CLI_NAMES = {"steps_filter": "only", "fail_step": "fail-step", "fail_lines": "fail-line"}


# FASTDIFF_SMOKE=1 (fdh.course.smoke_mode) changes the defaults as it does the notebooks' settings:
# the tiny model on the CPU, 2 steps, 2 timed runs, no extra runs; a flag given still wins.
SMOKE = " (FASTDIFF_SMOKE=1: {})"


def allow_patterns(hub_id: str, folders, variant: str | None) -> tuple[list[str], int]:
    """The files from_pretrained fetches for these weight folders with this variant (None:
    the plain files), as snapshot_download patterns with the configs, tokenizers and
    scheduler beside them, and their bytes still to download (the hub's sizes)."""
    sizes = file_sizes(hub_id)
    files, _ = weight_files(sizes, set(folders), variant)
    if "" in folders:  # one model at the repo's root: its config
        extra = ["config.json"]
    else:  # a pipeline: model_index.json names its folders; the ones without weights whole
        index = json.loads(Path(fetch(hub_id, "model_index.json")).read_text())
        named = [k for k, v in index.items() if isinstance(v, list) and k != "_class_name"]
        extra = ["model_index.json"] + [f"{k}/config.json" for k in folders]
        extra += [f"{k}/*" for k in named if k not in folders and not any(
            f.startswith(k + "/") and f.endswith((".safetensors", ".bin")) for f in sizes)]
    return files + extra, sum(sizes[f] for f in files if cached(hub_id, f) is None)


def check_online() -> None:
    """Refuse a download in huggingface_hub's offline mode before it asks the hub anything
    (every request raises OfflineModeIsEnabled there: huggingface_hub/utils/_http.py)."""
    if offline():
        raise FastdiffError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: huggingface_hub "
                            "is in offline mode and cannot download. Unset it on a machine "
                            "that reaches huggingface.co, or carry a filled cache here "
                            "(`download --dry-run` lists what the course needs). Nothing was "
                            "downloaded.")


def _common(p: argparse.ArgumentParser) -> None:
    smoke = smoke_mode()
    p.add_argument("--model", default="sdxl", choices=sorted(MODELS))
    p.add_argument("--weights", default="tiny" if smoke else "auto", choices=WEIGHTS,
                   help="default auto" + SMOKE.format("tiny"))
    p.add_argument("--steps", type=int, default=2 if smoke else None,
                   help="inference steps (model default" + SMOKE.format("2") + ")")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--runs", type=int, default=2 if smoke else 5,
                   help="timed calls (median reported)" + SMOKE.format("2"))
    p.add_argument("--max-runs", type=int, default=None,
                   help="timed calls at most, while the median is not steady (default 4 x runs"
                   + SMOKE.format("runs") + ")")
    p.add_argument("--warmup", type=int, default=1 if smoke else 2,
                   help="untimed calls, the cold start counted as the first")
    p.add_argument("--device", default="cpu" if smoke else None,
                   help="cuda, cuda:1, cpu (default: cuda if any" + SMOKE.format("cpu") + ")")
    p.add_argument("--prompt", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _autotune_flag(p)


AUTOTUNE_HELP = ("let compiles tune on a GPU (max-autotune's search, coordinate descent: tens "
                 "of minutes a recipe on a new GPU); without it they run without tuning unless "
                 "a tuning bundle covers them, and say so")


def _autotune_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--autotune", action="store_true", help=AUTOTUNE_HELP)


def _recipe_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vae", default=None, choices=sorted(VAES), help="swap the VAE")
    p.add_argument("--scheduler", default=None, choices=sorted(SCHEDULERS),
                   help="swap the scheduler")
    add_recipe_flags(p)  # one flag per Recipe field, from its Knob


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fastdiff_helpers",
                     description="fastdiff: benchmark fast diffusion inference recipes.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo_cmd = sub.add_parser("demo", help="what `make demo` runs: the blog's ladder (on a GPU "
                              "without autotuning or a tuning bundle, the course's) with this "
                              "machine's course settings, said before and explained after")
    demo_cmd.add_argument("--model", default="sdxl", choices=sorted(MODELS))
    demo_cmd.add_argument("--weights", default="auto", choices=WEIGHTS,
                          help="default: the course's for this machine (fdh.course.settings)")
    demo_cmd.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: the "
                          "course's for this machine)")
    demo_cmd.add_argument("--ladder", default=None, choices=sorted(LADDERS),
                          help=LADDER_HELP)
    demo_cmd.add_argument("--out", default=None, help="folder for results.jsonl, images, charts")
    demo_cmd.add_argument("--no-progress", action="store_true", help="no progress bars")
    _autotune_flag(demo_cmd)

    ladder = sub.add_parser("ladder", help="run every step of the blog's (or the course's) ladder")
    _common(ladder)
    ladder.add_argument("--ladder", default=None, choices=sorted(LADDERS), help=LADDER_HELP)
    ladder.add_argument("--out", default=None, help="folder for results.jsonl, images, charts")
    ladder.add_argument("--explain", action="store_true",
                        help="say what runs and what the numbers mean (make demo)")
    steps = sorted({n for steps in LADDERS.values() for n, _ in steps})
    ladder.add_argument("--only", action="append", default=None, metavar="STEP",
                        choices=steps, help="run only this step (repeatable)")
    ladder.add_argument("--fail-step", default=None, choices=steps,
                        help="testing aid: force this step to fail")

    bench = sub.add_parser("bench", help="benchmark one recipe given by flags")
    _common(bench)
    bench.add_argument("--out", default=None, help="append the result to OUT/results.jsonl")
    bench.add_argument("--step", default="custom", help="name of this result")
    _recipe_flags(bench)

    add_compile_commands(sub, _common, steps)
    add_download_command(sub)

    batch = sub.add_parser("batch", help="one image per line of a prompts file, in this process "
                           "or split over torchrun's / accelerate launch's processes")
    batch.add_argument("--prompts", required=True, metavar="FILE", help="one prompt a line")
    batch.add_argument("--out", required=True, help="folder: images/, images.jsonl, summary.json")
    batch.add_argument("--batch-size", type=int, default=1, help="prompts per pipeline call")
    batch.add_argument("--model", default="sdxl", choices=sorted(MODELS))
    batch.add_argument("--weights", default="tiny" if smoke_mode() else "auto", choices=WEIGHTS)
    batch.add_argument("--steps", type=int, default=2 if smoke_mode() else None)
    for flag in ("--height", "--width"):
        batch.add_argument(flag, type=int, default=None)
    batch.add_argument("--device", default="cpu" if smoke_mode() else None,
                       help="default: cuda:LOCAL_RANK if any, else cpu")
    batch.add_argument("--seed", type=int, default=0, help="line L gets seed SEED + L")
    batch.add_argument("--warmup", type=int, default=1, help="untimed calls per process")
    batch.add_argument("--fail-line", type=int, action="append", default=[],
                       help="testing aid: make this line's call fail")
    _autotune_flag(batch)
    _recipe_flags(batch)

    sub.add_parser("env", help="print the environment report")
    add_plan_command(sub)
    return parser


def _check_counts(args: argparse.Namespace) -> None:
    """The counts, sizes, seed and device of any command, before anything is loaded."""
    if getattr(args, "runs", None) is not None and args.max_runs is None and smoke_mode():
        args.max_runs = args.runs  # smoke mode proves the code runs: no extra timed runs
    for name in ("steps", "height", "width", "runs", "batch_size", "max_runs"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if getattr(args, "warmup", 0) < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    if getattr(args, "seed", 0) < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    for name in ("height", "width"):
        checks.image_size(name, getattr(args, name, None), size_multiple(args.model))
    if args.device is not None:
        checks.device(args.device)


def _bench(args: argparse.Namespace) -> None:
    recipe = recipe_from_args(args)  # RecipeError (invalid combination) before anything is loaded
    device = args.device or default_device()
    recipe.for_device(device)[0].check_device(device)  # and hardware this machine lacks (fp8)
    if args.out:  # and a folder of someone else's
        output_folder("out", args.out, RESULTS_FOLDER)
    pipe = load_pipeline(args.model, weights=args.weights, device=args.device,
                         dtype=recipe.weight_dtype,
                         vae=args.vae, scheduler=args.scheduler)
    apply(pipe, recipe, tuning=course_tuning)
    result = benchmark(pipe, prompt=args.prompt or DEFAULT_PROMPT, steps=args.steps,
                       height=args.height, width=args.width, runs=args.runs,
                       warmup=args.warmup, seed=args.seed, progress=not args.no_progress,
                       step=args.step, max_runs=args.max_runs)
    print(result.summary())
    print(format_table([result]))
    if args.out:
        store = save_result(result, args.out)
        print(f"fastdiff: appended to {store}, image {Path(args.out) / result.image_path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 invalid input)."""
    with checks.command_line(CLI_NAMES):  # messages name --flags, not Python arguments
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    # every command may import diffusers or torchao first (the clock through diffusers'
    # quantizers): the known harmless messages are silenced before, as in a notebook
    quiet_known_noise()
    try:
        args = build_parser().parse_args(argv)
        course_hooks()  # as in a notebook: a launched batch records its calls too
        if args.command == "env":
            print(env_report(as_text=True))
            return 0
        if args.command == "plan":
            return run_plan(args)
        if args.command == "download":
            return download(args.notebooks, args.models, args.dry_run, args.gpu)
        if args.command not in ("tuning", "clock"):
            _check_counts(args)
        if getattr(args, "autotune", False):
            set_autotune(True)  # this process's compiles may tune (course/planning/autotune.py)
        if getattr(args, "ladder", None) is not None or (args.command in LADDER_COMMANDS
                                                          and args.command != "demo"):
            args.ladder = resolve_ladder(args.model, args.ladder)  # refused before any work
        if args.command in COMPILE_COMMANDS:
            return COMPILE_COMMANDS[args.command](args, argv)
        if args.command == "demo":
            if args.out is not None:
                output_folder("out", args.out, RESULTS_FOLDER)
            results = demo.run_demo(args.out, model=args.model, weights=args.weights,
                                    device=args.device, ladder=args.ladder,
                                    progress=not args.no_progress)
            return 0 if any(r.ok for r in results) else 1
        if args.command == "batch":
            return batch_from_args(args, recipe_from_args(args))
        if args.command == "ladder":
            device = args.device or default_device()
            weights = resolve_weights(args.model, args.weights, device)
            if args.explain:
                print(demo.before(args.model, weights, device, args.ladder))
            results = run_ladder(
                model=args.model, weights=weights, steps=args.steps, height=args.height,
                width=args.width, runs=args.runs, warmup=args.warmup, out=args.out,
                device=device, steps_filter=args.only, progress=not args.no_progress,
                fail_step=args.fail_step, prompt=args.prompt, seed=args.seed,
                ladder=args.ladder, profile=args.explain, max_runs=args.max_runs)
            if args.explain:
                rates = demo.matmul_rates([r.recipe.get("dtype", "fp32") for r in results
                                           if r.ok]) if device == "cpu" else None
                print(demo.after(results, device, args.out, rates))
            return 0 if any(r.ok for r in results) else 1
        _bench(args)
        return 0
    except INPUT_ERRORS as exc:
        return refused(exc)


# What a command refuses as invalid input: said in one line, exit code 2 (refused).
INPUT_ERRORS = (UsageError, FastdiffError, RecipeError)


def refused(exc: Exception) -> int:
    """Say a refusal on stderr in one line, whatever the message; the exit code, 2. Shared by
    this command line and the project's own tools (tools/reference)."""
    message = " ".join(str(exc).split())
    print(f"fastdiff: error: {message}", file=sys.stderr)
    return 2


# -- plan and download ----------------------------------------------------------------------

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


def add_download_command(sub) -> None:
    p = sub.add_parser("download", help="fetch the weights the course (or the notebooks "
                       "named) loads, in the dtypes it runs them in, ahead of a workshop")
    p.add_argument("--notebooks", nargs="+", default=None, metavar="NN",
                   help="only what these notebooks need (numbers or names; default all)")
    p.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS) + list(VAES),
                   help="only these models")
    p.add_argument("--gpu", choices=list(PROFILES), default=None,
                   help="leave out the files of what does not fit this card (as the plan says)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would come down, and the GB, without downloading")


def download(notebooks=None, models=None, dry_run: bool = False, gpu: str | None = None) -> int:
    """Fetch (or with dry_run, list) what `notebooks` need, only `models` if given; for a card
    (`gpu`, a profile key), not the files of a model in a precision that does not fit it (the
    notebooks skip those cells there: models/fit.py, the plan's rule). Offline mode and the
    cache folder are checked first, before any network call."""
    if not dry_run:
        check_online()
        check_cache_folder()
    rows = course_downloads(notebooks)
    if models is not None:
        rows = [r for r in rows if r[0] in models]
    if gpu is not None:
        rows, left = for_card(rows, gpu_profile(gpu))
        for line in left:
            print(line)
    if not rows:
        raise FastdiffError("Nothing to download for these notebooks and models.")
    print(table(rows))
    if dry_run:
        return 0
    plans = []
    try:  # the repository being asked when the hub refuses is hub_id's
        for model, files, _, _ in rows:
            hub_id, parts = repo_folders(model)
            plans.append((model, files, hub_id,
                          *allow_patterns(hub_id, parts, wanted_variant(hub_id, files))))
        total = sum(p[-1] for p in plans)
        print(f"fastdiff: {total / GB:.1f} GB to download {check_disk(total, 'This download')}")
        for model, files, hub_id, patterns, todo in plans:
            print(f"fastdiff: {model} ({hub_id}), its {files} files: {todo / GB:.1f} GB")
            fetch(hub_id, patterns=patterns)
    except hub_errors().RepositoryNotFoundError as exc:  # GatedRepoError is one (errors.py)
        why = needs_access(hub_id, f"the hub refused the download: {type(exc).__name__}")
        raise FastdiffError(f"{why}. To get access: {gate_todo(hub_id)}; then run the command "
                            "again.") from None
    return 0
