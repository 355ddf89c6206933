"""A command that tunes keeps its tuning: the bundle written as it grows (every 30 s, at the
end, when cut by a budget or stopped by SIGTERM; a SIGKILL loses at most 30 s), beside a
progress file that says where the time went (05_cold_start.ipynb; `reference` and `warm`, in
tools/gpu_slot.sh: a lent GPU machine and its compile cache are gone soon after a command).

The progress file (JSON): dynamo's compile times (torch._dynamo.utils.compilation_time_metrics),
the two tuning counters (GEMM/conv shapes benchmarked, coordinate-descent configs timed), the
number of best configs, the last shape autotuned (torch's add_feedback_saver hook,
select_algorithm.py), whether choices were precompiled in parallel (inductor's "Multithreaded
precompilation" log line, select_algorithm.py make_precompile_fn, which precompiles nothing on
Python <= 3.11.8, cpython issue 106905), and the Triton kernels in coordinate descent. Such a
kernel's best config is provisional: inductor saves it marked found_by_coordesc before the
descent runs (triton_heuristics.py, CachingAutotuner.autotune_to_one_config), so a cut run
would leave one that skips the descent next time. It is dropped from the bundle, and from the
cache when cut here or by the next watch that finds the progress file of an unfinished run.

The hooks a TuningWatch puts into torch while it watches: torch's feedback saver (every
GEMM/conv choice), a wrapper around coordinate descent (which kernel is being descended on, and
whether its best config is provisional), and a handler of inductor's precompilation log line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
import logging
from pathlib import Path
from typing import Any, Callable

from ... import checks
from ..planning.compile_cache import use_course_cache
from ..planning.tuning_state import STATE
from ...measure.compile_events import events_between, snapshot
from ...measure.record import utc_now
from .bundle import check_bundle_path
from .bundle_cache import read_best_configs
from .bundle_io import export_tuning
from ..planning.writes import write_atomic

__all__ = ["TuningWatch", "progress_path", "install_hooks"]


def compile_times(top: int = 15) -> dict[str, list[float]]:
    """Seconds per dynamo_timed phase so far in this process: {phase: [times, total s]}, the
    largest first (safe to read from another thread)."""
    from torch._dynamo.utils import compilation_time_metrics

    for _ in range(3):  # the main thread may add a phase while this thread reads
        try:
            items = [(k, list(v)) for k, v in list(compilation_time_metrics.items())]
            break
        except RuntimeError:
            continue
    else:
        return {}
    rows = sorted(((k, [len(v), round(sum(v), 3)]) for k, v in items), key=lambda kv: -kv[1][1])
    return dict(rows[:top])


# --- The hooks a TuningWatch puts into torch -----------------------------------------------------

_LOGGER = "torch._inductor.select_algorithm"
# torch's, not ours to forget (no TuningState.reset): torch keeps a feedback saver for the process
_SAVER_ADDED: list[bool] = []


def _feedback(timings, name, input_nodes, choices, profiled, precompile_times) -> None:
    """torch's feedback hook (select_algorithm.add_feedback_saver): called for every GEMM/conv
    choice made, from stored timings or after benchmarking them."""
    if not STATE.watches or not timings:
        return
    try:
        shapes = ", ".join("x".join(str(s) for s in node.get_size()) for node in input_nodes)
        best = min(timings, key=timings.get)
        STATE.watches[-1].saw_choice(f"{name}({shapes}): {len(timings)} choices, best "
                               f"{getattr(best, 'name', best)} {timings[best]:.4f} ms")
    except Exception:  # a report must never break a compile
        pass


class _PrecompileLog(logging.Handler):
    """Keeps inductor's "Multithreaded precompilation for N choices using W worker threads"
    lines; passes what the logger would have shown anyway on to its parent."""

    def __init__(self, watch: Any, shown_from: int):
        super().__init__(logging.DEBUG)
        self.watch, self.shown_from = watch, shown_from

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Multithreaded precompilation"):
            self.watch.precompile_lines += 1
            self.watch.precompile_last = record.getMessage()
        if record.levelno >= self.shown_from:
            logging.getLogger(_LOGGER).parent.handle(record)


def install_hooks(watch: Any) -> list[Callable[[], None]]:
    """Put the hooks in place for `watch`; returns what undoes them (torch keeps its feedback
    savers for the process, so that one stays, reporting to no watch once none is active)."""
    from torch._inductor import select_algorithm
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    if not _SAVER_ADDED:  # torch keeps its feedback savers for the process
        select_algorithm.add_feedback_saver(_feedback)
        _SAVER_ADDED.append(True)
    original = CachingAutotuner.coordinate_descent_tuning

    def coordinate_descent_tuning(autotuner, launcher, *args, **kwargs):
        hook = getattr(autotuner, "save_cache_hook", None)
        local = getattr(getattr(hook, "__self__", None), "local_cache", None)
        rel = watch._relative(local[1]) if local else None
        if rel is None or not getattr(autotuner, "_should_coordesc_tune", True):
            return original(autotuner, launcher, *args, **kwargs)
        if watch._finished_config(rel):
            # a descent from a best config that a finished descent left (a cache of an
            # earlier run, a bundle): torch without the mark's fix descends again
            # (course/planning/coordesc.py, keep_coordesc_marks). A cut one leaves the file as
            # it was, and neither the bundle nor the next watch drops it.
            watch.redescents += 1
            return original(autotuner, launcher, *args, **kwargs)
        watch.in_descent.add(rel)
        watch.tuning_seen = True
        watch._write_progress()  # at once: a SIGKILL in the descent must find it
        try:
            return original(autotuner, launcher, *args, **kwargs)
        except BaseException:  # cut mid-descent (budget, SIGTERM): its entry is provisional
            watch._drop(rel)
            raise
        finally:
            watch.in_descent.discard(rel)

    CachingAutotuner.coordinate_descent_tuning = coordinate_descent_tuning
    undo = [lambda: setattr(CachingAutotuner, "coordinate_descent_tuning", original)]
    logger = logging.getLogger(_LOGGER)
    level, propagate = logger.level, logger.propagate
    shown_from = logger.getEffectiveLevel()
    handler = _PrecompileLog(watch, shown_from)
    logger.addHandler(handler)
    if shown_from > logging.INFO:  # let the INFO line be made, shown only to us
        logger.setLevel(logging.INFO)
        logger.propagate = False

    def restore_logger():
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    undo.append(restore_logger)
    return undo


# --- TuningWatch: a command that tunes keeps its tuning ------------------------------------------

EVERY_S = 30.0


def progress_path(bundle: str | os.PathLike) -> Path:
    """The progress file beside a bundle: sdxl.json.gz -> sdxl.progress.json."""
    bundle = Path(bundle)
    return bundle.with_name(bundle.name.removesuffix(".gz").removesuffix(".json")
                            + ".progress.json")


class TuningWatch:
    """Context manager around work that may tune (a compile with max-autotune): writes the
    bundle `bundle` (fdh.course.export_tuning, model `model`) and its progress file as it grows, and
    a last time on the way out, whatever the way. `write="auto"`: write only once there is
    tuning data (a CPU compile that tuned nothing leaves no file); "always": from the start.
    `note_step()` adds what one ladder step did to the run's record in the bundle.
    Introduced in docs/instructor.md."""

    def __init__(self, bundle: str | os.PathLike, model: str | None = None,
                 command: str | None = None, every_s: float = EVERY_S, write: str = "auto"):
        self.bundle, self.model, self.every_s, self.write = Path(bundle), model, every_s, write
        self.progress = progress_path(self.bundle)
        check_bundle_path("bundle", self.bundle)  # a file of someone else's: refused, now
        checks.output_file("bundle", self.progress, "sdxl.progress.json", lambda p: checks.
                           file_starts(p, b"{", b'"best_config_files"'), "a progress file")
        self.run: dict[str, Any] = {"id": uuid.uuid4().hex, "command": command,
                                    "started_at": utc_now(), "state": "running", "steps": {}}
        self.in_descent: set[str] = set()  # provisional best configs being descended on
        self.redescents = 0  # descents from a finished best config (pytorch#172819)
        self.last_autotune: str | None = None
        self.precompile_lines, self.precompile_last = 0, None
        self.dropped_from_cache: list[str] = []
        self.flushes, self.last_error = 0, None
        self._lock = threading.RLock()  # SIGTERM may flush while a flush runs
        self.tuning_seen = False
        self._stop = threading.Event()
        self._restore: list = []

    # --- hooks ------------------------------------------------------------------------------
    def saw_choice(self, line: str) -> None:
        from torch._dynamo.utils import counters

        autotunes = counters["inductor"]["select_algorithm_autotune"]
        if autotunes != getattr(self, "_autotunes_seen", None):  # this one was benchmarked
            self._autotunes_seen = autotunes
            self.last_autotune = "AUTOTUNE " + line
            self.tuning_seen = True

    def _relative(self, path: str) -> str | None:
        try:
            return Path(path).resolve().relative_to(self.cache.resolve()).as_posix()
        except (ValueError, OSError):
            return None

    def _install(self) -> None:
        self._restore.extend(install_hooks(self))
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)

            def terminated(signum, frame):
                self._finish("terminated")
                signal.signal(signal.SIGTERM, previous)
                if callable(previous):
                    previous(signum, frame)
                raise SystemExit(128 + signum)
            signal.signal(signal.SIGTERM, terminated)
            self._restore.append(lambda: signal.signal(signal.SIGTERM, previous))

    # --- what a cut run left ----------------------------------------------------------------
    def _finished_config(self, rel: str) -> bool:
        """Whether the kernel's best config on disk is one a finished descent left: as it was
        when the watch began (a previous unfinished run's were dropped first), or as a bundle
        imported in this process brought it; a provisional one, saved by inductor as the
        descent starts (triton_heuristics.py, autotune_to_one_config), is neither."""
        try:
            now = json.loads((self.cache / rel).read_text())
        except (OSError, json.JSONDecodeError):
            return False
        if not now.get("found_by_coordesc"):
            return False
        imported = STATE.imported_best.get(rel)
        return self._finished_at_start.get(rel) == now or (imported is not None and
                                                           imported[1] == now)

    def _drop(self, rel: str) -> None:
        """Remove one provisional best config (found_by_coordesc before its descent ended)."""
        target = (self.cache / rel).resolve()
        if self.cache.resolve() not in target.parents or not target.is_file():
            return
        try:
            provisional = json.loads(target.read_text()).get("found_by_coordesc")
        except (json.JSONDecodeError, OSError):
            provisional = True
        if provisional:
            target.unlink()
            self.dropped_from_cache.append(rel)

    def _drop_provisional(self) -> None:
        """Remove from the cache the best configs a previous run was still descending on when
        it ended unfinished (its progress file says which)."""
        if not self.progress.is_file():
            return
        try:
            previous = json.loads(self.progress.read_text())
        except (json.JSONDecodeError, OSError):
            return
        if previous.get("state") == "finished":
            return
        for rel in previous.get("coordesc_in_progress", []):
            self._drop(rel)

    # --- writing ----------------------------------------------------------------------------
    def events(self) -> dict[str, Any]:
        return events_between(self.before, snapshot())

    def note_step(self, name: str, seconds: float, events: dict[str, Any], state: str,
                  **more: Any) -> None:
        """What one step did (its wall seconds, tuning counters, how it ended) in the run."""
        self.run["steps"][name] = dict(
            wall_s=round(seconds, 1), autotunes=events.get("autotunes", 0),
            coordesc_benches=events.get("coordesc_benches", 0), state=state, **more)

    def _progress(self, state: str) -> dict[str, Any]:
        events = self.events()
        best = sum(1 for _ in self.cache.rglob("*.best_config")) if self.cache.is_dir() else 0
        parallel = (None if self.precompile_lines == 0 and not events["autotunes"] else
                    self.precompile_lines > 0)
        return {"command": self.run["command"], "state": state, "bundle": self.bundle.name,
                "started_at": self.run["started_at"], "updated_at": utc_now(),
                "elapsed_s": round(time.monotonic() - self._started, 1),
                "select_algorithm_autotune": events["autotunes"],
                "coordesc_tuning_bench": events["coordesc_benches"],
                "tuning_s": round(events["autotune_s"], 1), "best_config_files": best,
                "last_autotune": self.last_autotune,
                "precompiled_in_parallel": parallel, "precompile_last": self.precompile_last,
                "coordesc_in_progress": sorted(self.in_descent),
                "coordesc_redescents": self.redescents,
                "dropped_from_cache": self.dropped_from_cache,
                "compile_times": compile_times(), "steps": self.run["steps"],
                "flushes": self.flushes, "last_error": self.last_error}

    def _write_progress(self, state: str | None = None) -> None:
        if not (self.write == "always" or self.tuning_seen or self.bundle.exists()):
            return
        try:
            report = json.dumps(self._progress(state or self.run["state"]), indent=1,
                                sort_keys=True)
            write_atomic(self.progress, report + "\n")
        except Exception as exc:  # noqa: BLE001 (a progress report must not stop the work)
            self.last_error = f"{type(exc).__name__}: {exc}"

    def flush(self, state: str = "running") -> dict | None:
        """Write the bundle (if there is tuning data, or always) and the progress file now."""
        with self._lock:
            events = self.events()
            self.run.update(state=state, updated_at=utc_now(),
                            wall_s=round(time.monotonic() - self._started, 1),
                            autotunes=events["autotunes"],
                            coordesc_benches=events["coordesc_benches"],
                            autotune_s=round(events["autotune_s"], 1),
                            tuned=bool(events["autotunes"] or events["coordesc_benches"]))
            summary = None
            try:
                summary = export_tuning(self.bundle, self.model, cache_dir=self.cache,
                                        drop=tuple(self.in_descent), run=self.run,
                                        verbose=False, if_any=self.write != "always")
            except Exception as exc:  # noqa: BLE001 (the next flush tries again)
                error = f"{type(exc).__name__}: {exc}"
                if error != self.last_error:  # once, not at every flush
                    print(f"fastdiff: could not write the tuning bundle {self.bundle} ({error}); "
                          f"trying again; the tuning stays in {self.cache}", file=sys.stderr)
                self.last_error = error
            self.flushes += 1
            self._write_progress(state)
            return summary

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.flush("running")

    def _finish(self, state: str) -> None:
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        summary = self.flush(state)
        if summary is not None:
            print(f"fastdiff: tuning kept in {self.bundle} ({summary['gemm_blocks']} GEMM/conv "
                  f"shape(s), {summary['best_configs']} best config(s), "
                  f"{summary['bytes'] / 1024:.1f} KiB, SHA-256 {summary['sha256']}); "
                  f"progress in {self.progress}")

    def __enter__(self) -> "TuningWatch":
        self.cache = use_course_cache(verbose=False)
        self._drop_provisional()
        self._finished_at_start = {
            rel: config for rel, config in read_best_configs(self.cache).items()
            if isinstance(config, dict) and config.get("found_by_coordesc")}
        self.before = snapshot()
        self._started, self._finished = time.monotonic(), False
        self._install()
        STATE.watches.append(self)
        self._thread = threading.Thread(target=self._loop, name="fastdiff-tuning", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        name = getattr(exc_type, "__name__", "")
        state = ("finished" if exc_type is None else "cut" if name == "BudgetExceeded" else
                 "terminated" if exc_type in (SystemExit, KeyboardInterrupt) else "failed")
        try:
            self._finish(state)
        finally:
            if self in STATE.watches:
                STATE.watches.remove(self)
            for undo in reversed(self._restore):
                undo()
            self._restore.clear()
