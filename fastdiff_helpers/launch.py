"""Launching `batch` in new processes from Python: the command line a recipe becomes, and
`torchrun` run for a notebook cell (which may not define functions). Introduced in
11_scale_out.ipynb.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .batch import SUMMARY, Prompts, check_batch
from .loading import FastdiffError
from .recipe import Recipe


def recipe_flags(recipe: Recipe) -> list[str]:
    """The command-line flags of `bench` / `batch` that build `recipe` again."""
    if callable(recipe.quant_filter):
        raise FastdiffError("a recipe with a callable quant_filter has no command-line form; "
                            "use quant_filter='blog', 'fastdiff' or 'all'")
    flags = ["--dtype", recipe.dtype, "--attention", recipe.attention,
             "--compile", recipe.compile or "none", "--compile-scope", recipe.compile_scope,
             "--quantize", recipe.quantize or "none", "--quant-filter", recipe.quant_filter,
             "--conv1x1-to-linear", recipe.conv1x1_to_linear or "none"]
    if recipe.tf32 is not None:
        flags += ["--tf32", recipe.tf32]
    if recipe.dynamic is not None:
        flags += ["--dynamic", "true" if recipe.dynamic else "false"]
    switches = {"channels_last": "--channels-last", "fullgraph": "--fullgraph",
                "inductor_flags": "--inductor-flags", "fuse_qkv": "--fuse-qkv",
                "no_sync": "--no-sync"}
    flags += [flag for name, flag in switches.items() if getattr(recipe, name)]
    return flags + ([] if recipe.compile_vae else ["--no-compile-vae"])


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
    it wrote. A list of prompts is first written to OUT/prompts.txt. options: as run_batch
    (model, weights, device, batch_size, steps, height, width, seed, warmup).
    Introduced in 11_scale_out.ipynb."""
    out = Path(out)
    if not isinstance(prompts, (str, os.PathLike)):
        check_batch(prompts, out, options.get("batch_size", 1), processes)
        out.mkdir(parents=True, exist_ok=True)
        prompts_file = out / "prompts.txt"
        prompts_file.write_text("".join(f"{p}\n" for p in prompts), encoding="utf-8")
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
