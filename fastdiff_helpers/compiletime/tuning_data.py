"""A tuning bundle's format: its stamp (what the tuning is valid for), how it is read and
checked (gzip and json alone: nothing in it runs), how a cache folder's tuning is read, and
how two sets of GEMM timings merge. compiletime/tuning.py exports and imports bundles with it.

Introduced in 06_cold_start.ipynb. A bundle (gzip'd JSON):
    {"format": "fastdiff-tuning 1", "stamp": {...}, "model": "sdxl",
     "fp32_precisions": ["high"], "gemm": {op: {input key: {precision: {choice: ms}}}},
     "local": {key: ms or bool}, "best_configs": {"<xx>/<key>.best_config": {...}},
     "runs": [{the commands that tuned}]}
"gemm" keeps inductor's own nesting (torch/_inductor/codecache.py, PersistentCache.lookup).
"local" holds the single-key entries that share that file (LocalCache.set_value with one key):
pad_mm's pad-or-not benchmarks (torch/_inductor/fx_passes/pad_mm.py, get_pad_cache: "base mm
time: ..." -> ms, the padded key -> bool) and the scheduler's runtime benchmarks
(scheduler.py, get_estimate_runtime_cache). A bundle without it (none was written before) reads
as holding none.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
from pathlib import Path, PurePosixPath
from typing import Any

from .. import checks
from ..errors import FastdiffError
from ..measure.env import cpu_name

__all__ = ["FORMAT", "MUST_MATCH", "tuning_stamp", "read_bundle", "read_cache",
           "read_cache_parts", "split_timings", "differences", "merge_gemm", "merge_local",
           "show_tuning"]


FORMAT = "fastdiff-tuning 1"
# what must be equal between the machine that tuned and the one that imports
MUST_MATCH = ("torch", "triton", "cuda", "gpu_name", "sm_count", "capability", "cpu",
              "system_hash", "torch_key")
def _triton_version() -> str | None:
    try:
        from importlib import metadata
        return metadata.version("triton")
    except Exception:  # not installed (a CPU build of torch)
        return None


def tuning_stamp() -> dict[str, Any]:
    """What this machine's tuning is valid for: torch, triton, CUDA, the GPU's name, SM count
    and compute capability (the CPU's name without a GPU), inductor's system hash (the timings
    file's name) and torch_key (part of every best-config key).
    Introduced in 06_cold_start.ipynb."""
    import torch
    from torch._inductor.codecache import CacheBase, torch_key

    props = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"torch": torch.__version__, "triton": _triton_version(), "cuda": torch.version.cuda,
            "gpu_name": props.name if props else None,
            "sm_count": props.multi_processor_count if props else None,
            "capability": [props.major, props.minor] if props else None,
            "cpu": None if props else cpu_name(),
            "system_hash": CacheBase.get_system()["hash"], "torch_key": torch_key().hex()}


def _timings_file(cache: Path, system_hash: str) -> Path:
    return cache / "cache" / system_hash


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value))


def _safe_relative(rel: str) -> bool:
    """A path inside the cache folder: relative, no '..', no backslash, a .best_config."""
    path = PurePosixPath(rel)
    return (isinstance(rel, str) and rel.endswith(".best_config") and "\\" not in rel
            and not path.is_absolute() and ":" not in path.parts[0]
            and all(part not in ("", ".", "..") for part in path.parts))


def _read_timings(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("cache", {}) if path.is_file() else {}
    except (json.JSONDecodeError, OSError):  # being rewritten this instant: next time
        return {}


def _is_block(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(c, str) and _is_number(t)
                                           for c, t in value.items())


def split_timings(cache: dict) -> tuple[dict, dict]:
    """A timings file's "cache" object split by kind: (select_algorithm's GEMM/conv timings
    {op: {input key: {precision: {choice: ms}}}}, the single-key entries beside them {key: ms
    or bool}). Both share one file because both go through CacheBase.update_local_cache
    (codecache.py): PersistentCache nests four keys deep, LocalCache.set_value with one key
    (pad_mm.py, scheduler.py) stores a bare value; on an H200 with torch 2.11 an SDXL compile
    wrote 26 shapes of the first kind and 14 pad_mm entries of the second
    (results/h200/tuning/2.11.0+cu130/sdxl.cache-raw.tgz). Anything else is left out."""
    gemm: dict = {}
    local: dict = {}
    for key, value in cache.items():
        if isinstance(value, bool) or _is_number(value):
            local[key] = value
        elif isinstance(value, dict) and value and all(
                isinstance(p, dict) and all(_is_block(b) for b in p.values())
                for p in value.values()):
            gemm[key] = value
    return gemm, local


def read_cache_parts(cache_dir: str | os.PathLike, system_hash: str | None = None
                     ) -> tuple[dict, dict, dict]:
    """(GEMM timings, single-key entries, best configs) in an inductor cache folder: the
    timings file of this system read once and split (split_timings), and every *.best_config
    by its path relative to the folder. A file being written at that moment is skipped."""
    cache = Path(cache_dir)
    if system_hash is None:
        system_hash = tuning_stamp()["system_hash"]
    gemm, local = split_timings(_read_timings(_timings_file(cache, system_hash)))
    return gemm, local, read_best_configs(cache)


def read_best_configs(cache_dir: str | os.PathLike) -> dict:
    """Every *.best_config in an inductor cache folder, by its path relative to the folder (a
    file being written at that moment is skipped)."""
    cache = Path(cache_dir)
    best: dict = {}
    for file in sorted(cache.rglob("*.best_config")) if cache.is_dir() else []:
        try:
            best[file.relative_to(cache).as_posix()] = json.loads(file.read_text())
        except (json.JSONDecodeError, OSError):
            continue
    return best


def read_cache(cache_dir: str | os.PathLike, system_hash: str | None = None
               ) -> tuple[dict, dict]:
    """(GEMM timings, best configs) in an inductor cache folder: select_algorithm's part of the
    timings file of this system ({op: {input key: {precision: {choice: ms}}}}) and every
    *.best_config by its path relative to the folder (read_cache_parts, less the single-key
    entries)."""
    gemm, _, best = read_cache_parts(cache_dir, system_hash)
    return gemm, best


def _blocks(gemm: dict):
    for op, keys in gemm.items():
        for key, precisions in keys.items():
            for precision, block in precisions.items():
                yield (op, key, precision), block


def _check_bundle(bundle: Any, where: str) -> dict:
    """Refuse a bundle whose shape is not this format's, naming what is wrong."""
    def bad(what: str) -> FastdiffError:
        return FastdiffError(f"{where} is not a fastdiff tuning bundle ({what}): give a file "
                             "written by fdh.export_tuning or `python -m fastdiff_helpers "
                             "tuning export`.")

    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise bad(f"no format {FORMAT!r}")
    if not isinstance(bundle.get("stamp"), dict):
        raise bad("no stamp")
    gemm, best = bundle.get("gemm", {}), bundle.get("best_configs", {})
    if not isinstance(gemm, dict) or not isinstance(best, dict):
        raise bad("gemm and best_configs must be objects")
    for op, keys in gemm.items():
        if not isinstance(keys, dict) or not all(isinstance(p, dict) for p in keys.values()):
            raise bad(f"the timings of {op} are not nested objects")
    for (op, key, precision), block in _blocks(gemm):
        if not _is_block(block):
            raise bad(f"the timings of {op} {key[:40]} {precision} are not choice: ms")
    local = bundle.get("local", {})
    if not isinstance(local, dict) or not all(
            isinstance(v, bool) or _is_number(v) for v in local.values()):
        raise bad("local must map keys to a number or true/false")
    for rel, config in best.items():
        if not _safe_relative(rel):
            raise bad(f"best config path {rel!r} is not a relative path inside the cache "
                      "folder (no '..', no absolute path)")
        if not isinstance(config, dict):
            raise bad(f"best config {rel} is not an object")
    if not isinstance(bundle.get("runs", []), list):
        raise bad("runs must be a list")
    return bundle


def read_bundle(path: str | os.PathLike, sha256: str | None = None) -> dict:
    """A bundle's content, read with gzip and json alone (nothing in it runs). With `sha256`,
    the file's bytes must hash to it, checked before anything is parsed."""
    path = checks.existing_file("path", path, "a tuning bundle (.json.gz) written by "
                                "fdh.export_tuning")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256.strip().lower():
        raise FastdiffError(f"{path} has SHA-256 {digest}, not the {sha256.strip()} you were "
                            "given: it is not that file (changed, cut, or another one). "
                            "Nothing was imported.")
    try:
        bundle = json.loads(gzip.decompress(data))
    except (OSError, EOFError, ValueError) as exc:
        raise FastdiffError(f"{path} is not a gzip'd JSON tuning bundle ({exc}): give a file "
                            "written by fdh.export_tuning.") from None
    return dict(_check_bundle(bundle, str(path)), sha256=digest, bytes=len(data))


def differences(stamp: dict, here: dict) -> list[str]:
    """What differs between a bundle's stamp and this machine's, one phrase each."""
    return [f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}" for key in MUST_MATCH
            if stamp.get(key) != here.get(key)]


def merge_gemm(old: dict, new: dict) -> tuple[dict, int]:
    """`old` with every (op, input key, precision) block of `new` put in whole: a block is one
    run's timings of one shape, never mixed with another run's. Returns (merged, blocks new
    or changed)."""
    merged = json.loads(json.dumps(old))
    changed = 0
    for (op, key, precision), block in _blocks(new):
        slot = merged.setdefault(op, {}).setdefault(key, {})
        if slot.get(precision) != block:
            changed += 1
        slot[precision] = block
    return merged, changed


def merge_local(old: dict, new: dict) -> tuple[dict, int]:
    """`old` with every single-key entry of `new` put in (the newer run's value wins). Returns
    (merged, entries new or changed)."""
    merged = dict(old)
    changed = sum(merged.get(key) != value for key, value in new.items())
    merged.update(new)
    return merged, changed


def show_tuning(path: str | os.PathLike) -> str:
    """What a bundle holds, as text: its stamp, shapes per op, best configs (and how many
    coordinate descent found), the commands that tuned and their seconds, its SHA-256.
    Introduced in 06_cold_start.ipynb."""
    bundle = read_bundle(path)
    ops: dict[str, int] = {}
    for (op, _, _), _ in _blocks(bundle["gemm"]):
        ops[op] = ops.get(op, 0) + 1
    coordesc = sum(bool(c.get("found_by_coordesc")) for c in bundle["best_configs"].values())
    runs = bundle.get("runs", [])
    tuned = [r for r in runs if r.get("tuned")]
    lines = [f"{path}: {bundle['bytes'] / 1024:.1f} KiB, SHA-256 {bundle['sha256']}",
             f"model: {bundle.get('model') or '-'}; fp32 precisions: "
             f"{', '.join(bundle.get('fp32_precisions', [])) or '-'}"]
    lines += [f"  {key}: {bundle['stamp'].get(key)}" for key in MUST_MATCH]
    lines.append("GEMM/conv shapes: " + (", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
                                         or "none"))
    local = bundle.get("local", {})
    pads = sum(key.startswith("base mm time: ") or key.startswith("((torch.Size") for key in local)
    lines.append(f"single-key benchmarks: {len(local)} ({pads} of pad_mm)")
    lines.append(f"Triton best configs: {len(bundle['best_configs'])} ({coordesc} found by "
                 "coordinate descent)")
    for seed in bundle.get("seeded_from", []):
        lines.append(f"seeded from another GPU kind: tuned on the {seed.get('gpu_name')} "
                     f"({seed.get('source')})")
    lines.append(f"commands that tuned: {len(tuned)} of {len(runs)}, "
                 f"{sum(r.get('wall_s') or 0 for r in tuned):.0f} s in all")
    for r in runs:
        lines.append(f"  {r.get('started_at', '?')} {r.get('state', '?')}: {r.get('wall_s', 0):.0f} s,"
                     f" {r.get('autotunes', 0)} autotune(s), {r.get('coordesc_benches', 0)} "
                     f"coordinate-descent benchmark(s): {r.get('command', '')}")
    return "\n".join(lines)
