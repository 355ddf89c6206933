"""What CUDA graphs a compiled pipeline captured, replayed, re-recorded or skipped, and why.

Introduced in 12_cuda_graphs.ipynb; fdh.benchmark records it beside the compile events
(Result.compile_events["cudagraphs"]).

Read from torch's own records (torch 2.13):
- captures and re-records: the CUDA-graph trees of inductor's tree manager, one per device
  (torch/_inductor/cudagraph_trees.py: CUDAGraphTreeManager.roots, each CUDAGraphNode's
  children, read by tree_counts; record_function adds one node per capture; num_rerecord
  counts the unexpected re-records, those toward triton.cudagraph_unexpected_rerecord_limit);
- warm-up runs: the functions run eagerly once before their capture (warmed_up_functions);
- replays: calls of the manager's execute_node (the one path that replays a recorded graph),
  counted by a wrapper on the manager instance while a watch is on;
- skips: counters["inductor"]["cudagraph_skips"], and the reason torch logs with each
  (cudagraph_utils.log_cudagraph_skip_and_bump_counter, on the "cudagraphs" artifact logger).
The trees and the counters are process-wide (every compiled function on the device), so a
report over a call is the difference between two snapshots, as for the compile events. With
graph partitioning (torch._inductor.config.graph_partition, on by default) each partition of a
compiled graph is cudagraphified as a function of its own (output_code.py:294-383): a call of a
denoiser cut into partitions counts one capture, and later one replay, per partition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import FastdiffError
from ..models.loading import get_denoiser, pipeline_device, pipeline_info
from ..models.state import compiled_by_hand

__all__ = ["cudagraph_report", "cudagraph_snapshot", "cudagraph_events_between",
           "CudaGraphSnapshot"]

_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"  # getArtifactLogger(..., "cudagraphs")
_reasons: list[str] = []
_replays: dict[int, int] = {}  # device index -> replays counted since the watch began


class _ReasonHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _reasons.append(record.getMessage().split("\n")[0])


def _manager(device_index: int):
    """inductor's tree manager for this device, or None when nothing was captured there yet
    (never created here: creating one reserves a graph memory pool)."""
    if not torch.cuda.is_available():
        return None
    from torch._inductor import cudagraph_trees

    return cudagraph_trees.get_manager(device_index, create_if_none_exists=False)


def tree_counts(roots: dict[Any, list[Any]] | None) -> tuple[int, int]:
    """(captures, re-records) in CUDA-graph trees: every node is one capture; more than one
    node for a function under the same parent is a re-record of it."""
    captures = rerecords = 0
    pending = [roots or {}]
    while pending:
        children = pending.pop()
        for nodes in children.values():
            captures += len(nodes)
            rerecords += max(len(nodes) - 1, 0)
            pending.extend(node.children for node in nodes)
    return captures, rerecords


@dataclass
class CudaGraphSnapshot:
    captures: int = 0
    rerecords: int = 0
    unexpected_rerecords: int = 0
    warmed_up: int = 0
    replays: int = 0
    skips: int = 0
    reasons: list[str] = field(default_factory=list)


def cudagraph_snapshot(device_index: int = 0) -> CudaGraphSnapshot:
    """The process-wide CUDA-graph records of one device now (the skips: of every device),
    for cudagraph_report(pipe, since=...)."""
    from torch._dynamo.utils import counters

    logger = logging.getLogger(_LOGGER)  # keep the reasons torch logs for each skip, from now on
    if not any(isinstance(h, _ReasonHandler) for h in logger.handlers):
        logger.addHandler(_ReasonHandler(level=logging.WARNING))
    manager = _manager(device_index)
    if manager is not None and not getattr(manager, "_fastdiff_counted", False):
        original = manager.execute_node  # count its replays from now on

        def execute_node(node, new_inputs):
            _replays[device_index] = _replays.get(device_index, 0) + 1
            return original(node, new_inputs)

        manager.execute_node = execute_node
        manager._fastdiff_counted = True
    snap = CudaGraphSnapshot(skips=counters["inductor"]["cudagraph_skips"],
                             reasons=list(_reasons), replays=_replays.get(device_index, 0))
    if manager is not None and manager.roots is not None:
        snap.captures, snap.rerecords = tree_counts(manager.roots)
        snap.unexpected_rerecords = sum(sum(per.values()) for per in
                                        manager.num_rerecord.values())
        snap.warmed_up = len(manager.warmed_up_functions)
    return snap


def cudagraph_events_between(before: CudaGraphSnapshot, after: CudaGraphSnapshot
                             ) -> dict[str, Any]:
    """What happened to CUDA graphs between two snapshots, as a plain dict (it is kept in
    Result.compile_events)."""
    report = {name: getattr(after, name) - getattr(before, name) for name in
              ("captures", "replays", "rerecords", "unexpected_rerecords", "warmed_up", "skips")}
    report["skip_reasons"] = after.reasons[len(before.reasons):]
    return report


def _index(device: torch.device) -> int:
    """The CUDA device index the graphs are counted on (0 off a GPU: nothing is there)."""
    if device.type != "cuda":
        return 0
    return device.index if device.index is not None else torch.cuda.current_device()


def cudagraph_report(pipe, call: Callable[[], Any] | None = None,
                     since: CudaGraphSnapshot | None = None) -> dict[str, Any]:
    """The CUDA graphs behind this pipeline: captures, replays, re-records (and those torch
    calls unexpected), functions warmed up before capture, skips with torch's reasons, and
    `summary`, one line that says what happened or why none were captured ("none captured:
    cpu" on a CPU). Counts are process-wide on the pipeline's device: what `call()` did (run
    here once, as fdh.peak_memory runs its call), else since `since` (a cudagraph_snapshot():
    fdh.benchmark's own calls), else since the process started.
    Introduced in 12_cuda_graphs.ipynb."""
    device = pipeline_device(pipe)
    if call is not None:
        if since is not None:
            raise FastdiffError("Give cudagraph_report a call or a since, not both.")
        since = cudagraph_snapshot(_index(device))
        call()
    info = pipeline_info(pipe)
    # compiled through the helpers, else by hand (a notebook's plain torch.compile cell)
    compiled = info.applied.get("compile") or compiled_by_hand(get_denoiser(pipe))
    mode = compiled.get("mode") if isinstance(compiled, dict) else None
    if device.type != "cuda":
        report = cudagraph_events_between(CudaGraphSnapshot(), CudaGraphSnapshot())
        why = (f"compile={mode!r} ran without them" if mode else "the pipeline is not compiled")
        report["summary"] = (f"none captured: {device.type} (CUDA graphs record work queued on "
                             f"a CUDA stream; {why})")
        return report
    report = cudagraph_events_between(since or CudaGraphSnapshot(),
                                      cudagraph_snapshot(_index(device)))
    if not compiled:
        why = "none captured: the pipeline is not compiled"
    elif mode not in ("max-autotune", "reduce-overhead"):
        why = f"none captured: compile={mode!r} captures no CUDA graphs"
        why += "".join(f" ({note})" for note in info.notes if "CUDA graph" in note)
    elif report["captures"] == 0:
        why = "none captured" + (f": {report['skip_reasons'][-1]}" if report["skip_reasons"]
                                 else ": no call since the compile (call the pipeline twice)")
    else:
        why = (f"{report['captures']} captured, {report['replays']} replays, "
               f"{report['rerecords']} re-records, {report['skips']} skips")
    report["summary"] = why
    return report
