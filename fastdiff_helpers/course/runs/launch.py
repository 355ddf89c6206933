"""Launching `batch`: the command line a recipe becomes, `torchrun` run for a notebook cell
(which may not define functions), the `batch` command itself and its summary for people.
Introduced in 18_scale_out.ipynb.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ... import checks
from ...models.loading import FastdiffError
from ...techniques.recipe import KNOBS, Recipe
from .batch import IMAGES, SUMMARY, Prompts, check_batch, run_batch
from ..planning.writes import same_bytes


# what launch_batch passes on to `batch` (run_batch's arguments the command line has)
OPTIONS = ("model", "weights", "device", "batch_size", "steps", "height", "width", "seed",
           "warmup", "vae", "scheduler")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _words(name: str) -> dict[str, Any]:
    """A choice field's values by the word the command line writes: None, and False where it
    stands for "none of these" (conv1x1_to_linear), are "none"; True and False "true", "false"."""
    choices = KNOBS[name].choices
    return {("none" if v is None or (v is False and None not in choices) else
             str(v).lower() if isinstance(v, bool) else str(v)): v for v in choices}


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Recipe field, from its Knob: a switch for a True/False field (--no-NAME
    for one on by default), the words of its choices, else a number ("none": unset)."""
    for f in dataclasses.fields(Recipe):
        knob, flag = KNOBS[f.name], _flag(f.name)
        if knob.choices == (False, True):
            parser.add_argument(_flag("no_" + f.name) if f.default else flag, dest=f.name,
                                action="store_false" if f.default else "store_true",
                                help=knob.help)
        elif knob.choices:
            words = _words(f.name)
            default = next(w for w, v in words.items() if v == f.default and type(v) is type(
                f.default))
            parser.add_argument(flag, default=default, choices=list(words), help=knob.help)
        else:
            number = type(f.default) if f.default is not None else float
            parser.add_argument(flag, default=f.default, help=knob.help,
                                type=lambda s, n=number: None if s == "none" else n(s))


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The Recipe the flags of add_recipe_flags describe."""
    return Recipe(**{f.name: _words(f.name)[getattr(args, f.name)]
                     if KNOBS[f.name].choices and KNOBS[f.name].choices != (False, True)
                     else getattr(args, f.name) for f in dataclasses.fields(Recipe)})


def recipe_flags(recipe: Recipe) -> list[str]:
    """The command-line flags of `bench` / `batch` that build `recipe` again: one for each
    field away from its default (add_recipe_flags reads them)."""
    if callable(recipe.quant_filter):
        raise FastdiffError("a recipe with a callable quant_filter has no command-line form; "
                            "use quant_filter='blog', 'fastdiff' or 'all'")
    flags = []
    for f in dataclasses.fields(Recipe):
        value = getattr(recipe, f.name)
        if value == f.default and type(value) is type(f.default):
            continue
        if KNOBS[f.name].choices == (False, True):
            flags.append(_flag("no_" + f.name) if f.default else _flag(f.name))
        elif KNOBS[f.name].choices:
            flags += [_flag(f.name), next(w for w, v in _words(f.name).items()
                                          if v == value and type(v) is type(value))]
        else:
            flags += [_flag(f.name), "none" if value is None else str(value)]
    return flags


def batch_command(prompts_file: str | os.PathLike, out: str | os.PathLike, processes: int = 1,
                  recipe: Recipe | None = None, **options: Any) -> list[str]:
    """The command that runs `batch` over `processes` processes: `python -m fastdiff_helpers
    batch ...` for one, `torchrun --standalone --nproc_per_node K -m fastdiff_helpers batch
    ...` (as `python -m torch.distributed.run`) for more. options: model, weights, device,
    batch_size, steps, height, width, seed, warmup, vae, scheduler (None: left out)."""
    command = [sys.executable, "-m"]
    if processes > 1:  # --standalone: a free port, so two jobs on one machine do not collide
        command += ["torch.distributed.run", "--standalone", "--nproc_per_node",
                    str(processes), "-m"]
    command += ["fastdiff_helpers", "batch", "--prompts", str(prompts_file), "--out", str(out),
                *recipe_flags(recipe or Recipe())]
    for name, value in options.items():
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def launch_batch(prompts: Prompts, out: str | os.PathLike, processes: int = 2,
                 threads: int | None = None, recipe: Recipe | None = None,
                 **options: Any) -> dict[str, Any]:
    """Run `batch` in `processes` new processes (torchrun for more than one), each with
    `threads` CPU threads (OMP_NUM_THREADS; torchrun's default is 1), and return the summary
    it wrote. A list of prompts is first written to OUT/prompts.txt (one that holds other
    prompts is refused). options: as run_batch
    (model, weights, device, batch_size, steps, height, width, seed, warmup).
    Introduced in 18_scale_out.ipynb."""
    checks.whole("processes", processes, 1)
    checks.whole("threads", threads, 1, none=True)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise FastdiffError(f"launch_batch has no option {', '.join(unknown)}: it takes "
                            f"{', '.join(OPTIONS)} (as fdh.course.run_batch).")
    out = Path(out)
    if not isinstance(prompts, (str, os.PathLike)):
        check_batch(prompts, out, options.get("batch_size", 1), processes)
        out.mkdir(parents=True, exist_ok=True)
        prompts_file, text = out / "prompts.txt", "".join(f"{p}\n" for p in prompts).encode()
        if same_bytes(prompts_file, text) is False:  # another list's, or a file of yours
            raise FastdiffError(f"{prompts_file} holds other prompts: give that file as "
                                "`prompts`, or another `out`.")
        prompts_file.write_bytes(text)
        prompts = prompts_file
    every, todo = check_batch(prompts, out, options.get("batch_size", 1), processes)
    if not todo:  # nothing launched: the summary.json there is the last run's
        return dict(prompts=len(every), done=0, skipped=len(every), failed=0)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)  # this package, in the new processes
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = batch_command(prompts, out, processes, recipe, **options)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr + done.stdout).strip().splitlines() or ["(no output)"]
        reason = next((l for l in lines if "fastdiff: error:" in l), lines[-1])
        raise FastdiffError(f"`{' '.join(command[1:])}` exited with {done.returncode}: {reason}")
    return json.loads((out / SUMMARY).read_text())


def format_summary(summary: dict[str, Any]) -> str:
    """A few lines for people: images/s overall and per process, per-image latency.
    Introduced in 18_scale_out.ipynb."""
    if not summary.get("done") and "per_process" not in summary:
        return f"nothing to do: {summary['skipped']} of {summary['prompts']} prompts done before"
    lat = summary["latency_s"] or {}
    lines = [f"{summary['done']} images ({summary['skipped']} done before, {summary['failed']} "
             f"failed) in {summary['seconds']:.2f} s on {summary['processes']} process(es), "
             f"batch size {summary['batch_size']}: {summary['images_per_s']:.2f} images/s; "
             f"per image {lat.get('median', float('nan')):.3f} s (median)"]
    for s in summary["per_process"]:
        lines.append(f"  rank {s['rank']} ({s['device']}, {s['threads']} threads): "
                     f"{s['images']} images, {s['images_per_s']:.2f} images/s (load "
                     f"{s['load_s']:.1f} s, warm-up {s['warmup_s']:.1f} s)")
    return "\n".join(lines)


def end_process_group() -> None:
    """Destroy the process group a torchrun job ran on, while the interpreter is still whole.
    Left to exit with it, a process can die of SIGABRT after writing its images (twice in make
    test, "terminate called without an active exception": torchrun then reports the job
    failed): gloo's threads can still hold work whose tensors need the GIL during interpreter
    finalization (pytorch/pytorch#179291, where torch's fix was left aside; torch's
    distributed docs, "Shutdown", ask every process to call destroy_process_group at the end).
    destroy_process_group only drops torch's own references: the group, its two
    pt_gloo_runloop threads and its gloo_tcp_loop thread end only when nothing else holds it.
    torch/distributed/nn/functional.py gives ten functions `group=group.WORLD` as a default
    (lines 32-267), read when the module is imported; `import diffusers` imports it (through
    torch._dynamo and FSDP), so a pipeline loaded after the group was made keeps the group
    alive until exit. run_batch therefore imports diffusers before it makes the group.
    A process that never joined a group is left as it is."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def batch_from_args(args, recipe: Recipe) -> int:
    """The `batch` subcommand (cli.py parses, this runs); prints the summary on rank 0."""
    try:
        summary = run_batch(args.prompts, args.out, recipe, model=args.model,
                            weights=args.weights, device=args.device,
                            batch_size=args.batch_size, steps=args.steps, height=args.height,
                            width=args.width, seed=args.seed, warmup=args.warmup, vae=args.vae,
                            scheduler=args.scheduler, fail_lines=args.fail_line)
    finally:  # a rank that fails exits too: its error, not an abort at exit
        end_process_group()
    if summary is not None:
        print(format_summary(summary))
        if "per_process" in summary:
            out = Path(args.out)
            print(f"fastdiff: images in {out / IMAGES}, summary {out / SUMMARY}")
    return 0 if summary is None or not summary["failed"] else 1
