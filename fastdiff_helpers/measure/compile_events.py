"""What torch.compile did during a call: frames compiled, graph-cache hits, compile seconds.

Introduced in 05_cold_start.ipynb. Read from dynamo's own process-wide records
(torch._dynamo.utils.counters and compilation_time_metrics), as a difference between two
snapshots, so a benchmark can tell a compilation from a slow machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# compilation_time_metrics keys (torch/_dynamo/utils.py, torch 2.13): the whole compile of one
# frame, and the backend's share of it (AOTAutograd + inductor, autotuning included)
_COMPILE_KEY = "_compile.compile_inner"
_BACKEND_KEY = "OutputGraph.call_user_compiler"


@dataclass
class CompileSnapshot:
    frames: int
    graph_cache_hits: int
    graph_cache_misses: int
    seconds: dict[str, float] = field(default_factory=dict)
    autotunes: int = 0  # GEMM/conv shapes benchmarked (select_algorithm.py, benchmark)
    coordesc_benches: int = 0  # configs timed by coordinate descent (triton_heuristics.py)


def snapshot() -> CompileSnapshot:
    """The process-wide compile records now."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = {key: float(sum(values)) for key, values in compilation_time_metrics.items()
               if key in (_COMPILE_KEY, _BACKEND_KEY) or _tuning_key(key)}
    # frames: one _compile.compile_inner timing per frame compiled, fullgraph or not
    # (counters["frames"]["ok"] counts only the non-fullgraph path, convert_frame.py:2322)
    return CompileSnapshot(frames=len(compilation_time_metrics.get(_COMPILE_KEY, [])),
                           graph_cache_hits=counters["inductor"]["fxgraph_cache_hit"],
                           graph_cache_misses=counters["inductor"]["fxgraph_cache_miss"],
                           seconds=seconds,
                           autotunes=counters["inductor"]["select_algorithm_autotune"],
                           coordesc_benches=counters["inductor"]["coordesc_tuning_bench"])


def _tuning_key(key: str) -> bool:
    # dynamo_timed names of autotuning ("..._template_autotuning", "..._precompiling") and of
    # coordinate descent ("CachingAutotuner.coordinate_descent_tuning")
    key = key.lower()
    return "autotun" in key or "coordinate_descent" in key or "precompil" in key


def events_between(before: CompileSnapshot, after: CompileSnapshot) -> dict[str, Any]:
    """What compiled between two snapshots: frames (dynamo compiles, recompiles included), FX
    graph cache hits and misses, and seconds spent compiling (total, dynamo's tracing, the
    backend's (inductor) and, where torch records it, autotuning)."""
    def spent(key_test) -> float:
        return sum(after.seconds[k] - before.seconds.get(k, 0.0) for k in after.seconds
                   if key_test(k))

    total = spent(lambda k: k == _COMPILE_KEY)
    backend = spent(lambda k: k == _BACKEND_KEY)
    return {"frames": after.frames - before.frames,
            "graph_cache_hits": after.graph_cache_hits - before.graph_cache_hits,
            "graph_cache_misses": after.graph_cache_misses - before.graph_cache_misses,
            "compile_s": total, "dynamo_s": max(total - backend, 0.0), "inductor_s": backend,
            "autotune_s": spent(_tuning_key),
            "autotunes": after.autotunes - before.autotunes,
            "coordesc_benches": after.coordesc_benches - before.coordesc_benches}


def tuned(events: dict[str, Any]) -> bool:
    """Did this compile tune anything (benchmark a shape or a config)?"""
    return bool(events.get("autotunes") or events.get("coordesc_benches"))


def compiled(events: dict[str, Any]) -> bool:
    return events["frames"] > 0


def recompile_reasons() -> dict[str, list[str]]:
    """Why dynamo recompiled, per function (its guard failures so far in this process)."""
    from torch._dynamo.utils import guard_failures

    return {f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})":
            [str(r) for r in reasons] for code, reasons in guard_failures.items() if reasons}
