"""Adding tuning to an inductor cache folder (what import_tuning and import_raw share), and
what this process imported, by model (export_tuning leaves another model's unchanged blocks
out of a model's bundle). Introduced in 06_cold_start.ipynb, with the bundles.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import checks
from ..errors import FastdiffError
from ..techniques.compile_cache import use_course_cache
from .tuning_data import _blocks, _read_timings, _timings_file

__all__: list[str] = []


# (op, input key, precision) -> (model, block) of what import_tuning brought in this process:
# export_tuning for another model leaves those out while they are unchanged
_IMPORTED: dict[tuple[str, str, str], tuple[str | None, Any]] = {}
_IMPORTED_BEST: dict[str, tuple[str | None, Any]] = {}
_IMPORTED_LOCAL: dict[str, tuple[str | None, Any]] = {}


def _cache_folder(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is None:
        return use_course_cache(verbose=False)
    folder = checks.output_folder("cache_dir", cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder.absolute()


def _write_timings(path: Path, gemm: dict) -> None:
    from torch._inductor.codecache import CacheBase

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # inductor's own layout (CacheBase.update_local_cache)
    tmp.write_text(json.dumps({"system": CacheBase.get_system(), "cache": gemm}, indent=4))
    os.replace(tmp, path)


def _put(cache: Path, system_hash: str, content: dict, model: str | None, source: str,
         remember: bool = True) -> dict[str, int]:
    """Add to a cache folder what `content` ({"gemm", "local", "best_configs"}) holds and the
    folder lacks; what it holds is kept. `remember`: note what came from `model`'s bundle
    (export leaves it out of another model's bundle while unchanged)."""
    timings_file = _timings_file(cache, system_hash)
    timings = _read_timings(timings_file)  # both kinds of entry, as inductor keeps them
    added = kept = 0
    for (op, key, precision), block in _blocks(content.get("gemm", {})):
        if remember:
            _IMPORTED[(op, key, precision)] = (model, block)
        slot = timings.setdefault(op, {}).setdefault(key, {})
        if precision in slot:
            kept += 1
            continue
        slot[precision] = block
        added += 1
    local_added = 0
    for key, value in content.get("local", {}).items():
        if remember:
            _IMPORTED_LOCAL[key] = (model, value)
        if key in timings:
            kept += 1
            continue
        timings[key] = value
        local_added += 1
    if added or local_added:
        _write_timings(timings_file, timings)
    best_added = best_kept = 0
    root = cache.resolve()
    for rel, config in content.get("best_configs", {}).items():
        if remember:
            _IMPORTED_BEST[rel] = (model, config)
        target = (cache / rel).resolve()
        if root not in target.parents:  # _safe_relative already refused; kept as a guard
            raise FastdiffError(f"{source}: best config {rel!r} points outside {cache}.")
        if target.exists():
            best_kept += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, target)
        best_added += 1
    return {"blocks_added": added, "blocks_kept": kept, "local_added": local_added,
            "best_configs_added": best_added, "best_configs_kept": best_kept}
