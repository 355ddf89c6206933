"""The hooks a TuningWatch puts into torch while it watches: torch's feedback saver (every
GEMM/conv choice), a wrapper around coordinate descent (which kernel is being descended on, and
whether its best config is provisional), and a handler of inductor's precompilation log line.

Introduced in 05_cold_start.ipynb, with the watch (watch.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..planning.tuning_state import STATE

__all__ = ["install_hooks"]

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
            # (planning/coordesc.py, keep_coordesc_marks). A cut one leaves the file as
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
