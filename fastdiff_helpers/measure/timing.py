"""What benchmark() and profile() time with: synchronize(), stage marks around the text encoder,
the steps and the VAE decode, the progress bar, how sure a median is, and the process's peak
RSS. Introduced in 01_baseline.ipynb (through fdh.benchmark)."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .record import STEADY, uncertainty


STAGE_PREFIX = "fastdiff: "  # the stage ranges fdh.profile adds to its trace (not work)


def synchronize(device: str | torch.device) -> None:
    """Wait until every queued kernel on `device` has finished (no-op on a CPU).

    GPU work is asynchronous: a call returns as soon as its kernels are queued, so a clock
    read without this measures the queueing, not the work. Introduced in 01_baseline.ipynb."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StageMarks:
    """Stage boundaries of the calls made inside `marked()`, stamped by wrappers around
    pipe.encode_prompt, pipe.vae.decode and (with `steps`) pipe.scheduler.step: a CUDA event on a
    GPU, perf_counter on a CPU. The stages tile a call: "text encoders", then "denoising" (with
    `steps`: "step 1" ... "step N", each ended by the scheduler's step, the last running on to
    the decode's start: the loop's tail is denoising too), then "VAE decode". fdh.benchmark
    reads its three stages (read()); fdh.profile each stage (spans), with `ranges` also as named
    torch.profiler ranges for its trace."""

    def __init__(self, device: torch.device, steps: bool = False, ranges: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self.steps, self.ranges = steps, ranges
        self.spans: list[list[Any]] = []  # [name, start, end, profiler range]

    def now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def open(self, name: str, at: Any = None) -> None:
        """Open a stage; `at`: the stamp the stage before closed at, so that they tile."""
        rf = torch.profiler.record_function(STAGE_PREFIX + name) if self.ranges else None
        if rf is not None:
            rf.__enter__()
        self.spans.append([name, self.now() if at is None else at, None, rf])

    def close(self) -> Any:
        """Close the open stage, if any; its end stamp (None when none was open)."""
        if self.spans and self.spans[-1][2] is None:
            self.spans[-1][2] = self.now()
            if self.spans[-1][3] is not None:
                self.spans[-1][3].__exit__(None, None, None)
            return self.spans[-1][2]
        return None

    def seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1000
        return b - a

    def span(self, name: str) -> list[Any] | None:
        return next((s for s in self.spans if s[0] == name), None)

    def denoising(self) -> float | None:
        """From the end of the text encoders to the start of the VAE decode."""
        decode = self.span("VAE decode")
        first = next((s for s in self.spans if s[0] != "text encoders"), decode)
        return None if decode is None or first is decode else self.seconds(first[1], decode[1])

    def read(self) -> dict[str, float]:
        """fdh.benchmark's stage times of the call just made (a stage it did not reach left
        out); then forget the marks."""
        spans = {"text_encoding": self.span("text encoders"), "vae_decode": self.span("VAE decode")}
        times = {k: self.seconds(s[1], s[2]) for k, s in spans.items() if s and s[2] is not None}
        if (denoising := self.denoising()) is not None:
            times["denoising"] = denoising
        self.spans.clear()
        return {k: times[k] for k in ("text_encoding", "denoising", "vae_decode") if k in times}


@contextmanager
def marked(pipe, marks: StageMarks) -> Iterator[StageMarks]:
    """Wrap the pipeline's stage calls as instance attributes (restored on exit): wrappers
    around the calls, not module hooks, so a denoiser compiled in place or a vae.decode
    replaced by a compiled function is left as it is. functools.wraps keeps the signature a
    pipeline inspects (scheduler.step's eta and generator)."""
    saved = []

    def wrap(owner, attr, before, after):
        if not hasattr(owner, attr):
            return
        original = getattr(owner, attr)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            before()
            try:
                return original(*args, **kwargs)
            finally:
                after()

        saved.append((owner, attr, attr in owner.__dict__, owner.__dict__.get(attr)))
        setattr(owner, attr, wrapper)

    def encode_start():
        if not marks.spans:
            marks.open("text encoders")

    def encode_end():  # denoising starts where the text encoders end
        if len(marks.spans) == 1:
            marks.open("step 1" if marks.steps else "denoising", marks.close())

    def step_end():  # the last step stays open to the VAE decode's start
        done = sum(s[0].startswith("step ") for s in marks.spans)
        if done < len(pipe.scheduler.timesteps):
            marks.open(f"step {done + 1}", marks.close())

    wrap(pipe, "encode_prompt", encode_start, encode_end)
    if marks.steps:
        wrap(pipe.scheduler, "step", lambda: None, step_end)
    wrap(pipe.vae, "decode", lambda: marks.open("VAE decode", marks.close()), marks.close)
    try:
        yield marks
    finally:
        marks.close()
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
    cuda = device.type == "cuda"
    with profiling(cuda) as prof:
        call()
    totals: Counter[str] = Counter()
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if event.key.startswith("## Call CompiledFxGraph"):
            totals["inductor's generated code"] += us / 1e6
        elif us > 0 and not event.key.startswith("ProfilerStep"):
            totals[event.key] += us / 1e6
    return dict(totals.most_common(top))


@contextmanager
def profiling(cuda: bool) -> Iterator[Any]:
    """torch.profiler over the block (CPU ops, and CUDA kernels on a GPU), without kineto's C++
    "profiler_start" and "profiler_stop" lines, which no setting silences."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    with _no_stderr():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _no_stderr():
            prof.__exit__(None, None, None)


@contextmanager
def _no_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the duration (C++ libraries write there
    directly); only around the profiler's start and stop, never around work that may fail."""
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
