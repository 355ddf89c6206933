"""`make demo` (python -m fastdiff_helpers demo): the blog's ladder (on a GPU with autotuning
off and no tuning bundle that covers its compiled steps, the course's, which compiles without
tuning: demo_ladder) with the course's settings for this machine (fdh.course.settings, the same
as the notebooks and the playground), said up front with how long it will take here; on a
CPU its compiled steps compiled ahead, in parallel; and afterwards, each step's change explained from what was measured (its stages, its profile,
this CPU's measured matmul rates), beside the published GPU figures.

Introduced by `make demo`; `python -m fastdiff_helpers ladder --explain` prints the same
before/after text around any ladder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from ...models.dtypes import DTYPES
from ...models.presets import get_spec
from ..planning.autotune import autotune_enabled, tunes
from ..planning.tuning_state import covered_by
from ..planning.compile_cache import use_course_cache
from ..planning.ladders import LADDERS
from ...measure.flops import measure_matmul_tflops
from ...measure.record import Result, seconds_text
from ..planning.clock import ladder_estimate
from ..parameters import course_settings
from ..planning.published import BLOG_A100_SECONDS, BLOG_A100_WHERE
from .ladder import run_ladder

# --- What make demo says after its ladder --------------------------------------------------------

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _close(a: Result, b: Result) -> bool:
    """The two medians are within each other's uncertainty."""
    u = max(a.latency_uncertainty or 0.0, b.latency_uncertainty or 0.0)
    return abs(a.latency_s - b.latency_s) <= u * max(a.latency_s, b.latency_s)


def why(prev: Result, r: Result, device: str, rates: dict[str, float] | None = None) -> str:
    """One step against the one before, from what was measured: the times with their
    uncertainty, the stage that moved most, the op that moved most in the profile (when both
    were profiled), and for a precision change this CPU's measured matmul rates."""
    faster = r.latency_s < prev.latency_s
    said = (f"{r.step}: {seconds_text(r.latency_s)} s against {seconds_text(prev.latency_s)} s "
            f"for {prev.step}")
    if _close(prev, r):
        return said + " (within the timing uncertainty: no measurable difference here)."
    said += f" ({prev.latency_s / r.latency_s:.2f}x, {'faster' if faster else 'slower'})"
    parts = []
    deltas = {s: r.stages.get(s, 0.0) - prev.stages.get(s, 0.0)
              for s in set(r.stages) | set(prev.stages)}
    if deltas:
        stage = max(deltas, key=lambda s: -deltas[s] if faster else deltas[s])
        parts.append(f"{stage.replace('_', ' ')} {seconds_text(prev.stages.get(stage))} -> "
                     f"{seconds_text(r.stages.get(stage))} s")
    if r.ops and prev.ops:
        ops = {k: r.ops.get(k, 0.0) - prev.ops.get(k, 0.0) for k in set(r.ops) | set(prev.ops)}
        op = max(ops, key=lambda k: -ops[k] if faster else ops[k])
        parts.append(f"by the profiler, {op} moved most ({seconds_text(prev.ops.get(op, 0.0))} "
                     f"-> {seconds_text(r.ops.get(op, 0.0))} s per image)")
    dtype, before_dtype = r.recipe.get("dtype"), prev.recipe.get("dtype")
    if device == "cpu" and rates and dtype != before_dtype and dtype in rates:
        native = sorted(cpu_flags() & set(NATIVE_BF16))
        parts.append(f"a 512x512 matmul runs at {rates[dtype]:.0f} GFLOP/s in {dtype} against "
                     f"{rates.get(before_dtype, rates['fp32']):.0f} in "
                     f"{before_dtype if before_dtype in rates else 'fp32'} on this CPU (measured "
                     "now)" + ("" if dtype != "bf16" else
                               f"; it has {', '.join(native)}" if native else
                               "; it has no native bf16 (no avx512_bf16 or amx_bf16 in "
                               "/proc/cpuinfo)"))
    return said + (": " + "; ".join(parts) if parts else "") + "."


def after(results: Sequence[Result], device: str, out: str | None,
          rates: dict[str, float] | None = None,
          compiled_ahead: dict[str, float] | None = None, ladder: str = "blog") -> str:
    """The measured ladder beside the published A100 one, each step explained against the
    one before (why), and what to do next. For the course's ladder the blog's figure stands
    beside the step of the same name, which the blog ran its own way (said)."""
    ok = [r for r in results if r.ok and r.latency_s]
    lines = []
    if ok and ok[0].model in BLOG_A100_SECONDS:
        blog = BLOG_A100_SECONDS[ok[0].model]
        base = ok[0].latency_s
        lines.append(f"\n{'step':16} {'here (s)':>9} {'+-':>5} {'vs first':>9}   "
                     f"{'blog A100 (s)':>13} {'vs fp32':>8}")
        for r in ok:
            ref = blog.get(r.step)
            ref_text = f"{ref:13.3f} {blog['fp32'] / ref:7.2f}x" if ref else f"{'-':>13} {'-':>8}"
            u = r.latency_uncertainty
            lines.append(f"{r.step:16} {seconds_text(r.latency_s):>9} "
                         f"{(f'{u:.0%}' if u is not None else '-'):>5} "
                         f"{base / r.latency_s:8.2f}x   {ref_text}")
        lines.append(f"Published: {BLOG_A100_WHERE[ok[0].model]}.")
        if ladder != "blog":
            lines.append("The blog ran its own recipe for each of its steps: its fp32 with TF32 "
                         "on, its compiled steps with max-autotune and its four inductor flags; "
                         "the course's compiled steps here are fusion alone (notebook 04).")
        if ok[0].steps != 30:
            lines.append(f"Here each image has {ok[0].steps} denoising steps, the blog's 30: "
                         "compare the speed-ups, not the seconds.")
    if compiled_ahead:
        lines.append("The compiled steps were compiled ahead, in parallel ("
                     + ", ".join(f"{n}: {s:.0f} s" for n, s in compiled_ahead.items())
                     + "), so their cold start above is a warm cache's.")
    lines.append("\nWhat each step changed here, from what was measured:")
    for prev, r in zip(ok, ok[1:]):
        lines.append("  " + why(prev, r, device, rates))
    for r in ok:
        for flag in r.flags:
            lines.append(f"{r.step}: {flag}.")
    if out:
        lines.append(f"\nThis run is in {out} (results.jsonl, images/, ladder.png); "
                     "`make demo` writes each run to a new folder.")
    lines.append("Next: `make lab`, then open notebooks/00_setup.ipynb "
                 "(docs/workshop.md: how to reach JupyterLab on a remote machine).")
    return "\n".join(lines)


# --- make demo -----------------------------------------------------------------------------------

# Measured on this project's 2-core CPU machine (AMD EPYC, no GPU; issue 24): compiling one
# compiled step of the tiny SDXL (its UNet and VAE decode, as C++ kernels) costs about 100
# CPU-seconds (a first demo run took 413 CPU-s, a second, with the kernels cached, 122);
# a second run, compiled steps loaded from the cache, took 84 s of wall time there.
COMPILE_CPU_S = 100
WARM_RUN_S = 85


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _minutes(seconds: float) -> str:
    """Rounded to the half minute: an estimate, not a measurement."""
    half = max(round(seconds / 30), 1) / 2
    return f"{half:g}"


def _cache_files(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*")) if folder.is_dir() else 0


def before(model: str, weights: str, device: str, ladder: str, steps: int | None = None,
           cache: Path | None = None) -> str:
    """What runs, what its numbers can tell, and (on a CPU) roughly how long it takes here."""
    spec = get_spec(model)
    compiled = sum(1 for _, r in LADDERS[ladder] if r.compile)
    lines = [f"fastdiff demo: the {ladder} ladder on {spec.name}, {weights} weights, on {device}"
             + (f", {steps} denoising steps." if steps else ".")]
    if device == "cpu" and weights == "tiny":
        lines += [
            "  This machine has no CUDA GPU, so the demo runs the tiny model on the CPU: the same",
            "  classes and code paths as the real model, far smaller. Its timings show that every",
            "  step runs and what it costs here; they say nothing about GPU speed-ups, which come",
            "  from tensor cores, fused kernels and CUDA graphs a CPU does not have. The published",
            "  GPU figures are printed beside the table at the end."]
        n = cores()
        compile_s = compiled * COMPILE_CPU_S / n
        rest_s = WARM_RUN_S * 2 / n
        warm = cache is not None and _cache_files(cache) > 0
        lines += [
            f"  How long: about {_minutes(compile_s + rest_s)} minutes here for a first run "
            f"({n} CPU core{'s' if n > 1 else ''}), most of it",
            f"  compiling the {compiled} compiled steps (about {COMPILE_CPU_S} CPU-seconds "
            "each, measured on a 2-core machine),",
            "  at once in parallel processes; the time elapsed is shown as it goes. Their "
            "kernels stay in",
            f"  the compile cache ({cache}), so a second run takes about {_minutes(rest_s)} "
            "minutes" + (f"; the cache already holds {_cache_files(cache)} files." if warm
                         else ".")]
    elif device == "cpu":
        lines.append(f"  {weights} weights on a CPU: every step of the full-size model takes "
                     "minutes here; the tiny model (--weights tiny) is the CPU's first look.")
    elif weights == "random":
        lines.append("  Full-size architecture with random weights: real speed and memory, "
                     "meaningless images.")
    if device != "cpu":
        tuned = [name for name, r in LADDERS[ladder]
                 if r.compile and tunes(r.compile, r.inductor_flags)]
        clock = ladder_estimate(model, ladder, autotune_enabled())
        lines.append(f"  How long, on an H100 from an empty compile cache (the course clock's "
                     f"estimate, docs/workshop.md): about {clock['total_s'] / 60:.0f} minutes, "
                     f"{clock['compile_s'] / 60:.0f} of them compiling {clock['graphs']} "
                     "graphs" + (f", {clock['tune_s'] / 60:.0f} tuning" if clock['tune_s']
                                 else "") + "; a warm cache is quicker.")
        if tuned:
            lines.append(f"  {', '.join(tuned)}: autotuning on top"
                         + (" (switched on)." if autotune_enabled() else
                            " only where a tuning bundle covers it: autotuning is off, so the "
                            "others compile without it (a step that is autotuning alone is "
                            "not run)."))
    return "\n".join(lines)


def demo_ladder(model: str, weights: str, device: str) -> tuple[str, str]:
    """The ladder `make demo` runs here, and the line that says why. A CPU tunes nothing: the
    blog's ladder. On a GPU the blog's compiled steps tune for tens of minutes (max-autotune,
    its flags), so the blog's ladder runs only with autotuning switched on or where imported
    tuning bundles cover all of them; otherwise the course's ladder, whose compiled steps are
    fusion alone, beside the blog's published figures."""
    if not str(device).startswith("cuda"):
        return "blog", "fastdiff demo: the blog's ladder (a CPU tunes nothing: no wait for it)."
    steps = [r.for_device(device)[0] for _, r in LADDERS["blog"] if r.compile]
    if autotune_enabled():
        return "blog", ("fastdiff demo: the blog's ladder, autotuning switched on: its compiled "
                        "steps tune their kernels first (tens of minutes on a new GPU).")
    sources = [covered_by(get_spec(model).key, weights, r) for r in steps]
    if all(sources):
        return "blog", ("fastdiff demo: the blog's ladder, its tuning read from "
                        f"{', '.join(sorted(set(sources)))}.")
    return "course", ("fastdiff demo: the course's ladder, not the blog's: no tuning bundle of "
                      "this GPU covers the blog's compiled steps and autotuning is off, so they "
                      "would tune for tens of minutes first. The course's compiled steps are "
                      "fusion alone (about a minute a graph); the blog's A100 figures are shown "
                      "beside them. `--autotune` (or a bundle in results/<gpu>/tuning/) runs the "
                      "blog's ladder.")


def precompile(model: str, weights: str, device: str, ladder: str,
               progress: bool = True) -> dict[str, float]:
    """Compile every compiled step of the ladder into the compile cache at once, one new
    process per step (`python -m fastdiff_helpers warm --only STEP`), so that C++ compilation
    and the single-threaded lowering of different steps share the cores. Returns the compile
    seconds each process measured for its step (a step whose process failed is left out: the
    ladder compiles it itself). Says the elapsed time every 15 s, never a time left.

    Only on a CPU: on a GPU, concurrent autotuning would time kernels against each other."""
    names = [name for name, r in LADDERS[ladder] if r.compile]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # one compile thread per process: the processes share the cores already, and a pool of
    # compile workers per process only adds their start-up (compile_threads is not part of the
    # cache key, torch/_inductor/config.py _cache_config_ignore_prefix, so the ladder's own
    # compile finds these kernels); --no-tuning: a CPU compile tunes nothing, and warm's default
    # tuning root (results/ of the current folder) lies outside the demo's folder
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "fastdiff_helpers", "warm", "--model", model, "--weights",
         weights, "--device", device, "--ladder", ladder, "--only", name, "--steps", "2",
         "--no-tuning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for name in names}
    started = last = time.monotonic()
    if progress:
        print(f"fastdiff demo: compiling {len(names)} steps ahead, in {len(names)} processes "
              f"({', '.join(names)})", flush=True)
    while any(p.poll() is None for p in procs.values()):
        time.sleep(0.5)
        if progress and time.monotonic() - last >= 15:
            last = time.monotonic()
            done = sum(p.poll() is not None for p in procs.values())
            print(f"  compiling: {_clock(last - started)} elapsed, {done} of {len(names)} done",
                  flush=True)
    seconds = {}
    for name, proc in procs.items():
        out = proc.stdout.read() if proc.stdout else ""
        found = re.search(r"first call ([0-9.]+) s \(compile ([0-9.]+) s", out)
        if proc.returncode == 0 and found:
            seconds[name] = float(found.group(2))
        elif progress:
            tail = (out.strip().splitlines() or ["(no output)"])[-1]
            print(f"  {name}: compiling ahead failed ({tail}); the ladder compiles it itself")
    if progress:
        print(f"fastdiff demo: compiled ahead in {_clock(time.monotonic() - started)} "
              f"(compile time of each, its processes sharing the cores: "
              f"{', '.join(f'{n} {s:.0f} s' for n, s in seconds.items())})", flush=True)
    return seconds


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def matmul_rates(dtypes: Sequence[str]) -> dict[str, float]:
    """This CPU's dense matmul rate (GFLOP/s, 512x512, fdh.measure_matmul_tflops) in fp32 and
    each of `dtypes` the ladder used: measured now, for the explanations."""
    return {name: measure_matmul_tflops("cpu", dtype=DTYPES[name], n=512) * 1e3
            for name in dict.fromkeys(["fp32", *dtypes]) if name in DTYPES}


def run_demo(out: str | Path | None = None, model: str = "sdxl", weights: str = "auto",
             device: str | None = None, ladder: str | None = None, progress: bool = True
             ) -> list[Result]:
    """A ladder with the course's settings for this machine (fdh.course.settings: on a CPU the
    tiny model, TINY_STEPS steps, 64x64), said before; on a CPU compiled ahead in parallel;
    every step profiled once (Result.ops) and explained after. `ladder` None: the blog's on a
    CPU, and on a GPU where autotuning is on or bundles cover its compiled steps, else the
    course's (demo_ladder)."""
    settings = course_settings(model, weights=None if weights == "auto" else weights)
    device = device or settings.device
    if ladder is None:
        ladder, chosen = demo_ladder(model, settings.weights, device)
        print(chosen, flush=True)
    cache = use_course_cache(verbose=False)
    print(before(model, settings.weights, device, ladder, settings.steps, cache), flush=True)
    use_course_cache()  # said once, where the kernels go
    ahead = None
    if device == "cpu":
        ahead = precompile(model, settings.weights, device, ladder, progress)
    results = run_ladder(model, weights=settings.weights, steps=settings.steps,
                         height=settings.height, width=settings.width, runs=settings.runs,
                         warmup=settings.warmup, out=out, device=device, progress=progress,
                         ladder=ladder, profile=True, max_runs=settings.max_runs)
    rates = matmul_rates([r.recipe.get("dtype", "fp32") for r in results if r.ok]) \
        if device == "cpu" else None
    print(after(results, device, None if out is None else str(out), rates, ahead, ladder))
    return results
