"""results/README.md: one table per GPU and model, made anew from the committed records.

Written by the reference run (run.py) after every step. Introduced in
docs/offline-gpu.md, "On an offline GPU machine".
"""

from __future__ import annotations

import json
from pathlib import Path

from fastdiff_helpers import checks
from fastdiff_helpers.measure.record import seconds_text
from fastdiff_helpers.course.planning.published import BLOG_SOURCE, published_ladder
from fastdiff_helpers.course.planning.ladders import LADDERS
from fastdiff_helpers.results.store import Result, load_results
from fastdiff_helpers.measure.record import memory_text, psnr_text
from fastdiff_helpers.course.planning.writes import write_atomic

__all__ = ["write_results_readme", "check_results_readme", "STATE", "COMMAND"]

COMMAND = "python3 -m tools.reference"  # how to run the reference run, from the repository root

STATE = "reference.json"  # a results folder's state: the run's settings, matmul rate, attempts


def _rate_of(folder: Path, records: list[Result]) -> float | None:
    state = folder / STATE
    if state.exists():
        held = json.loads(state.read_text()).get("matmul") or {}
        if held.get("tflops"):
            return float(held["tflops"])
    rates = [r.matmul_tflops for r in records if r.matmul_tflops]
    return rates[0] if rates else None


def _ladder_of(folder: Path, records: list[Result]) -> str:
    state = folder / STATE
    if state.exists():
        run = json.loads(state.read_text()).get("run") or {}
        if run.get("ladder") in LADDERS:
            return run["ladder"]
    names = {r.step for r in records}
    return next((k for k, steps in LADDERS.items() if names <= {n for n, _ in steps}), "blog")


def tuning_seconds(folder: Path, model: str, torch_version: str) -> dict[str, float]:
    """Seconds of the commands that tuned each compiled step, summed across commands, from the
    model's tuning bundle beside the folder (<gpu>/tuning/<torch>/<model>.json.gz; every
    command that tuned wrote its run there: course/compiletime/watch.py). Read with gzip and json
    alone; no bundle: {}."""
    import gzip

    path = folder.parent / "tuning" / torch_version / f"{model}.json.gz"
    if not path.is_file():
        return {}
    spent: dict[str, float] = {}
    for run in json.loads(gzip.decompress(path.read_bytes())).get("runs", []):
        for step, done in (run.get("steps") or {}).items():
            if done.get("autotunes") or done.get("coordesc_benches"):
                spent[step] = spent.get(step, 0.0) + float(done.get("wall_s") or 0)
    return spent


def _table(folder: Path, records: list[Result]) -> list[str]:
    ladder = _ladder_of(folder, records)
    names = [n for n, _ in LADDERS[ladder]]
    by_step = {r.step: r for r in records}
    rate = _rate_of(folder, records)
    first = records[0]
    env = first.env or {}
    published = published_ladder(first.model, ladder) if first.weights != "tiny" else None
    blog = published[2] if published else {}
    who, gpu = ("published", "H100") if ladder == "flux" else ("blog", "A100")
    base_name = names[0].split(",")[0]  # "fp32" (the blog's and the course's), "bf16" (Flux's)
    lines = [f"### {first.device_name}: {first.model} (`{folder.parent.name}/{folder.name}/`)", "",
             f"{ladder} ladder, {first.weights} weights, {first.height}x{first.width}, "
             f"{first.steps} steps, batch 1; torch {env.get('torch', '?')}, diffusers "
             f"{env.get('diffusers', '?')}, torchao {env.get('torchao', '?')}, driver "
             f"{env.get('driver') or '-'}. Dense "
             f"{'bf16' if env.get('device') == 'cuda' else 'fp32'} matmul rate measured on it: "
             + (f"{rate:.4g} TFLOP/s; every row's share is of this rate, whatever the row's "
                "own precision." if rate else "not measured.")]
    kinds = {r.peak_memory_kind for r in records if r.peak_memory_kind}
    lines.append("Peak memory: " + (" / ".join(sorted(
        {"cuda_max_allocated": "CUDA max allocated (reserved beside it: CUDA-graph pools "
         "included)", "process_peak_rss": "the process's peak RSS"}.get(k, k) for k in kinds))
        or "not measured") + ".")
    tuning = tuning_seconds(folder, first.model, env.get("torch", "?"))
    lines.append("Cold start of a compiled step: a new process with the tuning data of "
                 f"`{folder.parent.name}/tuning/{env.get('torch', '?')}/` imported, that "
                 "tuned nothing (the reference run measures a compiled step only then); "
                 "tuning, once: the seconds of the commands that tuned it, summed"
                 + ("." if tuning else " (no step here has tuned yet)."))
    if first.weights in ("random", "tiny"):
        lines.append(f"{first.weights.capitalize()} weights: the PSNR column shows how far "
                     f"each step moves the numbers from the {base_name} image, never image "
                     "quality.")
    if published and ladder == "flux":
        lines.append(f"Published: {published[1]}; the course's Flux ladder, not the blog's.")
    lines += ["", f"| step | seconds (median) | IQR | vs {base_name} | vs prev | peak memory | "
              "peak reserved | cold start | tuning, once | TFLOP/s | share of matmul rate | "
              f"PSNR vs {base_name} | {who} {gpu} s | {who} vs {base_name} |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = by_step.get(names[0])
    base_s = base.latency_s if base is not None and base.error is None else None
    prev = None
    for name in names:
        r = by_step.get(name)
        blog_s = blog.get(name)
        blog_cells = (f"{blog_s:g} | {blog[names[0]] / blog_s:.2f}x" if blog_s and
                      blog.get(names[0]) else "- | -")
        tuned = f"{tuning[name]:.0f} s" if name in tuning else "-"
        if r is None:
            lines.append(f"| {name} | not measured yet | | | | | | | {tuned} | | | | "
                         f"{blog_cells} |")
            continue
        if r.error is not None or not r.latency_s:
            lines.append(f"| {name} | FAILED: {(r.error or 'no timing').splitlines()[0][:80]} "
                         f"| | | | | | | {tuned} | | | | {blog_cells} |")
            continue
        share = r.tflops_per_s / rate if r.tflops_per_s and rate else None
        lines.append(
            f"| {name} | {seconds_text(r.latency_s)} | {seconds_text(r.latency_iqr_s)} | "
            + (f"{base_s / r.latency_s:.2f}x" if base_s else "-") + " | "
            + (f"{prev / r.latency_s:.2f}x" if prev else "-") + " | "
            f"{memory_text(r.peak_memory_bytes)} | {memory_text(r.peak_reserved_bytes)} | "
            f"{seconds_text(r.cold_start_s)} s | {tuned} | "
            + (f"{r.tflops_per_s:.4g}" if r.tflops_per_s else "-") + " | "
            + (f"{share:.1%}" if share else "-") + f" | {psnr_text(r.quality)} | {blog_cells} |")
        prev = r.latency_s
    return lines


def check_results_readme(root: str | Path) -> Path:
    """root/README.md, if write_results_readme may write it: new, or one it wrote (its first
    line and its "made anew by" sentence); any other README is left as it is (refused)."""
    # "made anew by `python -m fastdiff_helpers reference`": what the run said before it moved
    # here from the package (issue 58), so a table written then is still its own
    return checks.output_file("README", Path(root) / "README.md", "README.md", lambda p: any(
        checks.file_starts(p, b"# Reference results", b"made anew by `" + command)
        for command in (COMMAND.encode(), b"python -m fastdiff_helpers reference")),
                              "a results table that the reference run wrote")


def write_results_readme(root: str | Path) -> Path | None:
    """results/README.md, made anew from every results/<gpu>/<model>/results.jsonl: one table
    per GPU and model (seconds, spread, speed-ups, memory, cold start, achieved TFLOP/s and its
    share of the measured matmul rate, PSNR, the blog's A100 figures beside). None when the
    root holds no results; a README.md there that it did not write is refused."""
    root = Path(root)
    check_results_readme(root)
    stores = sorted(root.glob("*/*/results.jsonl"))
    if not stores:
        return None
    lines = ["# Reference results", "",
             f"Measured by this project (the device each table names); made anew by `{COMMAND}` "
             "(tools/reference/) after every step: edit the records, "
             "not this file. Each folder holds `results.jsonl` (every timed sample, the "
             "environment, cold-start split), `reference.json` (the matmul rate, every "
             "attempt), the charts and the fp32 image. Compare seconds only between rows of "
             "one table. The blog's figures are its A100-80GB ones "
             f"({BLOG_SOURCE}).", ""]
    verdicts = sorted(root.glob("*/gpu-tests.md"))
    if verdicts:
        lines += ["GPU test verdicts: " + ", ".join(f"[{p.parent.name}]({p.relative_to(root)})"
                                                     for p in verdicts) + ".", ""]
    for store in stores:
        records = load_results(store)
        if records:
            lines += _table(store.parent, records) + [""]
    write_atomic(root / "README.md", "\n".join(lines).rstrip() + "\n")
    return root / "README.md"
