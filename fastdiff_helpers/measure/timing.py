"""What benchmark() times with: stage marks around the text encoder and the VAE decode, the
progress bar (calls and time elapsed, never a guessed time left), how sure a median is, and the
process's peak RSS. Introduced in 01_baseline.ipynb (through fdh.benchmark)."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .record import STEADY, median_interval


class _Marks:
    """Timestamps at the stage wrappers: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: dict[str, Any] = {}

    def mark(self, name: str, keep_first: bool) -> None:
        if keep_first and name in self.marks:
            return
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def _between(self, a: str, b: str) -> float | None:
        if a not in self.marks or b not in self.marks:
            return None
        if self.cuda:
            self.marks[b].synchronize()
            return self.marks[a].elapsed_time(self.marks[b]) / 1000
        return self.marks[b] - self.marks[a]

    def reset(self) -> None:
        self.marks.clear()

    def read(self) -> dict[str, float]:
        """Stage durations of the call just made; then forget the marks."""
        spans = {"text_encoding": self._between("encode_start", "encode_end"),
                 "denoising": self._between("encode_end", "decode_start"),
                 "vae_decode": self._between("decode_start", "decode_end")}
        self.marks.clear()
        return {k: v for k, v in spans.items() if v is not None}


@contextmanager
def _stage_marks(pipe, device: torch.device) -> Iterator[_Marks]:
    """Wrap pipe.encode_prompt and pipe.vae.decode as instance attributes, restored on exit.

    Wrappers, not module hooks: the techniques compile the denoiser in place and replace
    vae.decode with a compiled function, and a wrapper around the call changes neither."""
    marks = _Marks(device)
    saved = []
    for owner, attr, start, end in ((pipe, "encode_prompt", "encode_start", "encode_end"),
                                    (pipe.vae, "decode", "decode_start", "decode_end")):
        if not hasattr(owner, attr):
            continue
        original = getattr(owner, attr)

        def timed(*args, _original=original, _start=start, _end=end, **kwargs):
            marks.mark(_start, keep_first=True)
            try:
                return _original(*args, **kwargs)
            finally:
                marks.mark(_end, keep_first=False)

        saved.append((owner, attr, attr in owner.__dict__, owner.__dict__.get(attr)))
        setattr(owner, attr, timed)
    try:
        yield marks
    finally:
        for owner, attr, had_own, value in reversed(saved):
            if had_own:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)


@contextmanager
def _ticking(bar) -> Iterator[None]:
    """Refresh a progress bar every second while one long call runs (tqdm redraws, and so
    shows the elapsed time, only when told to)."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            bar.refresh()

    if not bar.disable:
        threading.Thread(target=tick, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def uncertainty(samples: list[float]) -> float | None:
    """How far the median of `samples` may be off, as a share of it (Result.latency_uncertainty)."""
    if len(samples) < 2:
        return None
    median = statistics.median(samples)
    low, high, _ = median_interval(samples)
    return max(median - low, high - median) / median if median else None


def until_steady(measure: Callable[[], float], runs: int, max_runs: int,
                 before_more: Callable[[float | None], None] | None = None) -> list[float]:
    """Seconds of `runs` calls of `measure` (one timed run each), then of more, up to
    `max_runs`, until their median is known within +-record.STEADY (uncertainty()): how
    fdh.benchmark and the reports that time a call take enough runs to be steady.
    `before_more(u)` is called before each added run with the uncertainty so far."""
    samples: list[float] = []
    while len(samples) < max_runs:
        if len(samples) >= runs:  # the runs asked for are done: steady yet?
            u = uncertainty(samples)
            if u is not None and u <= STEADY:
                break
            if before_more is not None:
                before_more(u)
        samples.append(measure())
    return samples


def steady_note(samples: list[float], runs: int, max_runs: int) -> str | None:
    """What until_steady did beyond the runs asked for, said in a result's notes (None if
    nothing): the runs added, and the uncertainty left where max_runs stopped it first."""
    if len(samples) <= runs:
        return None
    u = uncertainty(samples)
    return (f"{len(samples) - runs} more timed run(s) than runs={runs} to settle the median"
            + ("" if u is not None and u <= STEADY else
               f"; still +-{u:.0%} at max_runs={max_runs} (a busy machine, or a call whose "
               "time varies)"))


def progress_bar(total: int, desc: str, disable: bool, file: Any = None):
    """A tqdm bar that shows calls done and the time elapsed, never an estimate of what is
    left: one call may compile for minutes and the next take a second, so any rate-based
    "remaining" is made up."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False, disable=disable, file=file,
                bar_format="{desc}: {n_fmt}/{total_fmt} calls, {elapsed} elapsed")


def profile_ops(call, device: torch.device, top: int = 8) -> dict[str, float]:
    """Seconds of the `top` ops that took most time in one call of `call` under
    torch.profiler: self CPU time, or self device time on CUDA. What the demo explains a
    slower step with (demo.why), instead of a reason written in advance."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    with _no_stderr():  # kineto's C++ "profiler_start" line, which no setting silences
        prof.__enter__()
    try:
        call()
    finally:
        with _no_stderr():  # and its "profiler_stop"
            prof.__exit__(None, None, None)
    rows = []
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us > 0 and not event.key.startswith(("ProfilerStep", "## Call CompiledFxGraph")):
            rows.append((event.key, us / 1e6))
        elif event.key.startswith("## Call CompiledFxGraph"):
            rows.append(("inductor's generated code", us / 1e6))
    totals: dict[str, float] = {}
    for key, seconds in rows:
        totals[key] = totals.get(key, 0.0) + seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])[:top])


@contextmanager
def _no_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the duration (C++ libraries write there
    directly); only around the profiler's start and stop, never around work that may fail."""
    import os

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
