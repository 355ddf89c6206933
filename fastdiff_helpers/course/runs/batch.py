"""Batch generation: one image per prompt of a file, in one process or in every process of a
`torchrun` / `accelerate launch`, resumable after a kill.

Introduced in 18_scale_out.ipynb. The work is split with accelerate's PartialState (it reads
the launcher's rank, world size and local rank; gloo on a CPU); each process loads its own
pipeline on its own device, applies the recipe, and writes each image as it finishes. An
image's seed is its line number (plus `seed`), so the image does not depend on the split.

Files under `out`: images/NNNNN.png (NNNNN: the prompt's line number), images.jsonl (one line
per image or failure, appended), summary.json (rank 0, after every process finished).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ...errors import FastdiffError
from ... import checks
from ...models.loading import call_kwargs, load_pipeline, pipeline_info
from ...models.presets import size_multiple
from ...models.pretrained import check_weights
from ...techniques import apply
from ..planning.autotune import course_tuning
from ...techniques.recipe import Recipe
from ...measure.env import env_report
from ..planning.writes import output_folder, write_atomic

IMAGES = "images"
RECORDS = "images.jsonl"
SUMMARY = "summary.json"
MEASURED = ("steady state: from a barrier after every process loaded its pipeline, applied the "
            "recipe and made its warm-up calls, to each process's last image; images/s overall "
            "is all images over the slowest process's time")
Prompts = Sequence[str] | str | os.PathLike
Lines = list[tuple[int, str]]  # [(line number, prompt)]


def read_prompts(prompts: Prompts) -> Lines:
    """[(line number, prompt)] from a file (one prompt a line) or a list of strings; blank
    lines are skipped but counted, so a prompt keeps its line number (1-based)."""
    if isinstance(prompts, (str, os.PathLike)):
        path = checks.existing("prompts", prompts, "a text file with one prompt per line")
        lines = path.read_text(encoding="utf-8").splitlines()
        where = str(path)
    else:
        if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
            raise FastdiffError(f"{checks.arg('prompts')} takes a file path or a list of strings, "
                                f"not {type(prompts).__name__}.")
        lines, where = list(prompts), "the prompt list"
    found = [(i, text.strip()) for i, text in enumerate(lines, start=1) if text.strip()]
    if not found:
        raise FastdiffError(f"{where} holds no prompts (only blank lines or nothing); give one "
                            "prompt per line")
    return found


def image_path(out: str | os.PathLike, line: int) -> Path:
    """Where the image of the prompt on `line` goes: OUT/images/00042.png."""
    return Path(out) / IMAGES / f"{line:05d}.png"


def pending(prompts: Lines, out: str | os.PathLike) -> Lines:
    """The prompts that have no image under `out` yet (an image is written whole or not at
    all, so one that exists is finished)."""
    return [(line, text) for line, text in prompts if not image_path(out, line).exists()]


def launched_processes() -> int:
    """The world size the launcher (torchrun, accelerate launch, mpirun) set; 1 without one."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE",
                             "MV2_COMM_WORLD_SIZE"], 1)


def check_batch(prompts: Prompts, out: str | os.PathLike, batch_size: int = 1,
                processes: int | None = None) -> tuple[Lines, Lines]:
    """Validate the input before anything slow; returns (every prompt, those left to do)."""
    checks.whole("batch_size", batch_size, 1)
    checks.whole("processes", processes, 1, none=True)
    # created when written; a rerun does what is left; someone else's folder is refused
    out = output_folder("out", out, (RECORDS, IMAGES, SUMMARY, "prompts.txt"), "batch")
    every = read_prompts(prompts)
    todo = pending(every, out)
    processes = launched_processes() if processes is None else processes
    calls = len(batches(every, todo, batch_size))
    if todo and processes > calls:
        smaller = f", or a batch size below {batch_size}" if batch_size > 1 else ""
        raise FastdiffError(f"{processes} processes for {len(todo)} prompt(s) left to do (of "
                            f"{len(every)}) in {calls} call(s) of batch size {batch_size}; "
                            f"launch at most {calls} processes (--nproc_per_node / "
                            f"--num_processes){smaller}")
    return every, todo


def batches(every: Lines, todo: Lines, batch_size: int) -> list[Lines]:
    """The pipeline calls: the whole file cut into fixed groups of `batch_size` prompts, less
    those done. Cut before splitting between processes, so an image is made in the same batch
    (the same arithmetic) however many processes share the work."""
    left = set(todo)
    groups = [[p for p in every[i:i + batch_size] if p in left]
              for i in range(0, len(every), batch_size)]
    return [g for g in groups if g]


# --- writing as each image finishes -------------------------------------------------------

def _append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line in one write on an O_APPEND descriptor (processes never interleave
    within a line), then fsync: what was written survives a kill."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_atomic(image, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    image.save(tmp)
    os.replace(tmp, path)  # the final name appears only with the whole file behind it


def read_records(out: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of OUT/images.jsonl (a last line cut by a kill is skipped)."""
    path = Path(out) / RECORDS
    if not path.exists():
        return []
    records = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(text))
        except json.JSONDecodeError:
            continue  # only a write cut short can leave a bad line
    return records


def _recover(every: Lines, out: Path, seed: int) -> None:
    """An image written just before a kill, whose record was not: record it now; and clear
    the temporary files of writes a kill cut short."""
    for tmp in (out / IMAGES).glob(".*.tmp.png"):
        tmp.unlink(missing_ok=True)
    recorded = {r["line"] for r in read_records(out) if "error" not in r}
    for line, text in every:
        if line not in recorded and image_path(out, line).exists():
            _append(out / RECORDS, dict(line=line, prompt=text, seed=seed + line, seconds=None,
                                        rank=None, image=image_path(out, line).relative_to(
                                            out).as_posix(), recovered=True))


def _call(pipe, group: Lines, kwargs: dict[str, Any], seed: int,
          fail_lines: frozenset[int]):
    bad = [line for line, _ in group if line in fail_lines]
    if bad:
        raise RuntimeError(f"forced failure of line(s) {bad} (fail_lines, a testing aid)")
    return pipe(**dict(kwargs, prompt=[text for _, text in group],
                       generator=[torch.Generator("cpu").manual_seed(seed + line)
                                  for line, _ in group])).images


def _generate(pipe, groups, out: Path, kwargs, seed: int, rank: int,
              fail_lines: frozenset[int]) -> list[dict[str, Any]]:
    records = []
    groups = list(groups)
    while groups:
        group = groups.pop(0)
        started = time.perf_counter()
        try:
            images = _call(pipe, group, kwargs, seed, fail_lines)
        except Exception as exc:  # one failing call must not stop the others: recorded below
            if len(group) > 1:  # find which prompt fails: its companions go on one by one
                groups[:0] = [[item] for item in group]
                continue
            line, text = group[0]
            record = dict(line=line, prompt=text, seed=seed + line, rank=rank,
                          error=f"{type(exc).__name__}: {exc}")
            _append(out / RECORDS, record)
            records.append(record)
            continue
        # output_type="pil" copies the images to the host: the call has finished on the device
        seconds = (time.perf_counter() - started) / len(group)
        for (line, text), image in zip(group, images):
            path = image_path(out, line)
            _save_atomic(image, path)
            record = dict(line=line, prompt=text, seed=seed + line, seconds=seconds, rank=rank,
                          batch_size=len(group), image=path.relative_to(out).as_posix())
            _append(out / RECORDS, record)
            records.append(record)
    return records


def run_batch(prompts: Prompts, out: str | os.PathLike, recipe: Recipe | None = None,
              model: str = "sdxl", weights: str = "auto", device: str | None = None,
              batch_size: int = 1, steps: int | None = None, height: int | None = None,
              width: int | None = None, seed: int = 0, warmup: int = 1, vae: str | None = None,
              scheduler: str | None = None,
              fail_lines: Sequence[int] = ()) -> dict[str, Any] | None:
    """One image per prompt (a file, one prompt a line, or a list), written under `out` as it
    finishes; in this process, or split over every process of `torchrun` / `accelerate launch`.
    Introduced in 18_scale_out.ipynb.

    Prompts whose image exists are skipped (a rerun after a kill finishes the job); the rest
    are split between the processes, each with its own pipeline on its own device (cuda:RANK,
    or the CPU) and `recipe` applied. The seed of line L is seed + L. `batch_size` prompts go
    into one pipeline call (per-image latency = call time / batch size); `warmup` untimed calls
    per process come first. A failing prompt is recorded (an "error" line in images.jsonl) and
    the others go on. fail_lines: testing aid, lines whose call is made to fail.

    Returns the summary (also written to OUT/summary.json) on the main process, None on the
    others; with nothing left to do, a summary with "done": 0 and nothing loaded."""
    from accelerate import PartialState  # imported here: accelerate takes seconds to import
    from accelerate.utils import broadcast_object_list, gather_object, get_int_from_env

    recipe = recipe or Recipe()
    if not isinstance(recipe, Recipe):
        raise FastdiffError(f"recipe must be a fdh.Recipe, not {type(recipe).__name__}")
    every, todo = check_batch(prompts, out, batch_size)  # before anything slow
    checks.call_size(steps, height, width, size_multiple(model))
    checks.whole("seed", seed, 0)
    checks.whole("warmup", warmup, 0)
    check_weights(weights)
    if device is not None:
        checks.device(device)
    on_gpu = torch.cuda.is_available() and not (device or "").startswith("cpu")
    local = get_int_from_env(["LOCAL_WORLD_SIZE"], 1)  # processes on this machine
    if on_gpu and local > torch.cuda.device_count():
        raise FastdiffError(f"{local} processes on this machine but {torch.cuda.device_count()} "
                            "GPU(s): process r runs on cuda:r, so launch one process per GPU "
                            "(--nproc_per_node), or pass --device cpu")
    out = Path(out)
    if not todo:
        print(f"fastdiff: all {len(every)} prompts have an image in {out / IMAGES}; nothing "
              "to do")
        return dict(prompts=len(every), done=0, skipped=len(every), failed=0)
    (out / IMAGES).mkdir(parents=True, exist_ok=True)
    # imported before the group exists, or the group outlives destroy_process_group (a default
    # argument of torch.distributed.nn.functional holds it): launch.end_process_group
    import diffusers  # noqa: F401
    state = PartialState(cpu=not on_gpu)
    todo = broadcast_object_list([todo])[0]  # main's list: every process cuts the same calls
    if state.is_main_process:
        _recover(every, out, seed)
    if device is None or (device == "cuda" and state.num_processes > 1):
        device = "cpu" if state.device.type == "cpu" else str(state.device)

    started = time.perf_counter()
    pipe = apply(load_pipeline(model, weights=weights, device=device, vae=vae,
                               dtype=recipe.weight_dtype,
                               scheduler=scheduler, verbose=state.is_main_process), recipe,
                 tuning=course_tuning)
    load_s = time.perf_counter() - started
    kwargs = call_kwargs(pipe, steps=steps, height=height, width=width)
    with state.split_between_processes(batches(every, todo, batch_size)) as mine:
        mine = list(mine)  # this process's calls
    started = time.perf_counter()
    for _ in range(warmup):  # untimed: the first call pays for allocations (and compile)
        try:
            _call(pipe, mine[0], kwargs, seed, frozenset())
        except Exception:  # a failing prompt: the timed loop below records it
            break
    warmup_s = time.perf_counter() - started
    state.wait_for_everyone()  # the timed part starts together
    started = time.perf_counter()
    records = _generate(pipe, mine, out, kwargs, seed, state.process_index,
                        frozenset(fail_lines))
    seconds = time.perf_counter() - started
    ok = sum("error" not in r for r in records)
    mine_stats = dict(rank=state.process_index, device=device, threads=torch.get_num_threads(),
                      prompts=sum(map(len, mine)), images=ok, seconds=seconds,
                      images_per_s=ok / seconds, load_s=load_s, warmup_s=warmup_s)
    stats = gather_object([mine_stats])
    records = gather_object(records)
    if not state.is_main_process:
        state.wait_for_everyone()
        return None
    latencies = [r["seconds"] for r in records if "error" not in r]
    slowest = max(s["seconds"] for s in stats)
    summary = dict(
        model=model, weights=pipeline_info(pipe).weights, recipe=recipe.to_dict(),
        batch_size=batch_size, steps=kwargs["num_inference_steps"], height=kwargs["height"],
        width=kwargs["width"], seed=seed, processes=state.num_processes,
        prompts=len(every), done=len(latencies), skipped=len(every) - len(todo),
        failed=len(records) - len(latencies), failed_lines=sorted(r["line"] for r in records
                                                                  if "error" in r),
        images_per_s=len(latencies) / slowest, seconds=slowest, per_process=stats,
        latency_s=dict(median=statistics.median(latencies), mean=statistics.fmean(latencies),
                       min=min(latencies), max=max(latencies)) if latencies else None,
        measured=MEASURED, env=env_report())
    write_atomic(out / SUMMARY, json.dumps(summary, indent=1, sort_keys=True, default=str)
                 + "\n")
    state.wait_for_everyone()  # the others return once the summary is written
    return summary
