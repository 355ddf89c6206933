"""Coordinate descent runs once per kernel: its found_by_coordesc mark kept through the compile
worker's pickle where Triton's Config loses it (pytorch/pytorch#172819, open).

Introduced in 05_cold_start.ipynb (tuning that travels as data and is not done again).
fdh.compile_pipeline applies it on a GPU before a compile that tunes.
"""

from __future__ import annotations

import functools

__all__ = ["keep_coordesc_marks", "marks_lost"]


@functools.cache
def _config_class() -> type | None:
    try:
        from triton import Config
    except ImportError:  # a CPU build of torch: no Triton, no coordinate descent
        return None
    return Config


def marks_lost(config_class: type) -> bool:
    """Whether a config's found_by_coordesc survives a pickle round trip of this class."""
    import pickle

    config = config_class({"XBLOCK": 8}, num_warps=2)
    config.found_by_coordesc = True
    return not getattr(pickle.loads(pickle.dumps(config)), "found_by_coordesc", False)


def keep_coordesc_marks(config_class: type | None = None) -> bool:
    """Make `config_class` (Triton's Config) keep found_by_coordesc through a pickle round
    trip, where it loses it; returns whether a patch is in place.

    Why: inductor compiles Triton kernels in worker processes and pickles each kernel back
    (torch/_inductor/runtime/compile_tasks.py, _worker_compile_triton). A kernel whose best
    config the autotune cache holds from coordinate descent comes back marked
    found_by_coordesc=True (autotune_cache.py, check_autotune_cache), but Triton's
    Config.__setstate__ restores only its own fields (triton PR 6595), so the mark is gone in
    the parent and CachingAutotuner.run descends again (triton_heuristics.py, run: `if not
    getattr(self.launchers[0].config, "found_by_coordesc", False)`): pytorch/pytorch#172819,
    open; #181292 proposes a flag that survives the pickle. The patch is applied only where
    the round trip loses the mark, and is a no-op once Triton or torch keep it."""
    config_class = config_class or _config_class()
    if config_class is None:
        return False
    if getattr(getattr(config_class, "__setstate__", None), "_fastdiff_keeps_mark", False):
        return True
    if not marks_lost(config_class):
        return False
    original = config_class.__setstate__

    def __setstate__(self, state):
        original(self, state)
        if isinstance(state, dict) and state.get("found_by_coordesc"):
            self.found_by_coordesc = True

    __setstate__._fastdiff_keeps_mark = True
    __setstate__._fastdiff_original = original
    config_class.__setstate__ = __setstate__
    return True
