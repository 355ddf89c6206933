"""An inductor cache folder's tuning: read (the timings file of this system, split by kind, and
the best configs), added to (what import_tuning and import_raw share: what the folder holds is
kept), and a GPU slot's by-hand fallback read back: a tarball of what a cache folder held
(`<model>.cache-raw.tgz`, tools/gpu_slot.sh brings one back after every command), imported like
a bundle where its timings file is this machine's (bundle_io.import_matching takes these first).
What was added from a model's bundle is noted in course/planning/tuning_state.py (STATE.imported*):
export_tuning leaves another model's unchanged blocks out of a model's bundle.

Introduced in 05_cold_start.ipynb, with the bundles (bundle.py).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from ... import checks
from ...errors import FastdiffError
from ..planning.compile_cache import use_course_cache
from ..planning.tuning_state import STATE, seed
from .bundle import (blocks, raw_kind_problems, safe_relative, split_timings, tuning_stamp)
from ..planning.writes import output_folder, write_atomic

__all__ = ["timings_file", "read_timings", "read_cache_parts", "read_best_configs",
           "cache_folder", "write_timings", "add_to_cache", "import_raw"]


def timings_file(cache: Path, system_hash: str) -> Path:
    return cache / "cache" / system_hash


def read_timings(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("cache", {}) if path.is_file() else {}
    except (json.JSONDecodeError, OSError):  # being rewritten this instant: next time
        return {}


def read_cache_parts(cache_dir: str | os.PathLike, system_hash: str | None = None
                     ) -> tuple[dict, dict, dict]:
    """(GEMM timings, single-key entries, best configs) in an inductor cache folder: the
    timings file of this system read once and split (split_timings), and every *.best_config
    by its path relative to the folder. A file being written at that moment is skipped."""
    cache = Path(cache_dir)
    if system_hash is None:
        system_hash = tuning_stamp()["system_hash"]
    gemm, local = split_timings(read_timings(timings_file(cache, system_hash)))
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


def cache_folder(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is None:
        return use_course_cache(verbose=False)
    folder = output_folder("cache_dir", cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder.absolute()


def write_timings(path: Path, gemm: dict) -> None:
    from torch._inductor.codecache import CacheBase

    # inductor's own layout (CacheBase.update_local_cache)
    write_atomic(path, json.dumps({"system": CacheBase.get_system(), "cache": gemm},
                                 indent=4))


def add_to_cache(cache: Path, system_hash: str, content: dict, model: str | None, source: str,
                 remember: bool = True) -> dict[str, int]:
    """Add to a cache folder what `content` ({"gemm", "local", "best_configs"}) holds and the
    folder lacks; what it holds is kept. `remember`: note what came from `model`'s bundle
    (export leaves it out of another model's bundle while unchanged)."""
    file = timings_file(cache, system_hash)
    timings = read_timings(file)  # both kinds of entry, as inductor keeps them
    added = kept = 0
    for (op, key, precision), block in blocks(content.get("gemm", {})):
        if remember:
            STATE.imported[(op, key, precision)] = (model, block)
        slot = timings.setdefault(op, {}).setdefault(key, {})
        if precision in slot:
            kept += 1
            continue
        slot[precision] = block
        added += 1
    local_added = 0
    for key, value in content.get("local", {}).items():
        if remember:
            STATE.imported_local[key] = (model, value)
        if key in timings:
            kept += 1
            continue
        timings[key] = value
        local_added += 1
    if added or local_added:
        write_timings(file, timings)
    best_added = best_kept = 0
    root = cache.resolve()
    for rel, config in content.get("best_configs", {}).items():
        if remember:
            STATE.imported_best[rel] = (model, config)
        target = (cache / rel).resolve()
        if root not in target.parents:  # safe_relative already refused; kept as a guard
            raise FastdiffError(f"{source}: best config {rel!r} points outside {cache}.")
        if target.exists():
            best_kept += 1
            continue
        write_atomic(target, json.dumps(config))
        best_added += 1
    return {"blocks_added": added, "blocks_kept": kept, "local_added": local_added,
            "best_configs_added": best_added, "best_configs_kept": best_kept}


def import_raw(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
               verbose: bool = True, from_kind: str | None = None) -> dict[str, Any] | None:
    """The by-hand fallback of a GPU slot whose bundle could not be written (issue 34): a
    tarball of what an inductor cache folder held, its timings file (`cache/<system hash>`)
    and `*.best_config` files, committed as `<model>.cache-raw.tgz` beside the bundles. Read
    with tarfile and json alone (nothing is extracted, nothing in it runs). Only the timings
    file named by this machine's system hash is taken: inductor's own key for that file
    (CacheBase.get_local_cache_path, codecache.py), a hash of the GPU name and the triton and
    CUDA versions. Best configs are taken as they are: their names hold torch_key(), so
    another torch build never looks them up. Added like a bundle (what the cache holds is
    kept) and not remembered as imported: the next export of its model writes it into that
    model's stamped bundle. Returns what was added; None when nothing in it is this machine's.

    `from_kind`: the GPU kind whose timings file to take instead (another kind of this GPU's
    design, course/compiletime/bundle.py: its name in the file's own system record, its SM count and
    capability known and equal to this GPU's, the same triton and CUDA); refused otherwise,
    before anything is written. Recorded as a seed (course/planning/tuning_state.py seeded_from).
    """
    from torch._inductor.codecache import CacheBase

    here_system = CacheBase.get_system()
    system_hash = here_system["hash"]
    refused: list[str] = []
    path = checks.existing("path", path, "a tarball of an inductor cache folder's "
                           "tuning (<model>.cache-raw.tgz)")
    content: dict[str, Any] = {"gemm": {}, "local": {}, "best_configs": {}}
    mine = False
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar.getmembers():
                rel = PurePosixPath(member.name)
                rel = PurePosixPath(*[part for part in rel.parts if part != "."])
                if not member.isfile() or member.size > 64 * 2**20:
                    continue
                is_timings = (rel == PurePosixPath("cache", system_hash) if from_kind is None
                              else rel.parent == PurePosixPath("cache") and len(rel.parts) == 2
                              and not rel.name.endswith(".best_config"))
                if not (is_timings or safe_relative(rel.as_posix())):
                    continue  # another machine's timings file, or not inductor's
                data = json.loads(tar.extractfile(member).read())
                if not isinstance(data, dict):
                    continue
                if is_timings and from_kind is not None:
                    problems = raw_kind_problems(data.get("system"), here_system, from_kind,
                                                 *_this_gpu())
                    if problems:
                        refused.append(f"{rel.name[:12]}...: {'; '.join(problems)}")
                        continue
                if is_timings:
                    timings = data.get("cache")
                    content["gemm"], content["local"] = split_timings(
                        timings if isinstance(timings, dict) else {})
                    mine = True
                else:
                    content["best_configs"][rel.as_posix()] = data
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise FastdiffError(f"{path} is not a readable tarball of an inductor cache's tuning "
                            f"({exc}).") from None
    if from_kind is not None and not mine:
        raise FastdiffError(f"{path} holds no timings file of the {from_kind} that this GPU may "
                            f"take ({'; '.join(refused) or 'none at all'}). Nothing was "
                            "imported.")
    if not mine:
        return None
    if from_kind is not None:
        seed(None, from_kind, str(path))
    cache = cache_folder(cache_dir)
    counts = add_to_cache(cache, system_hash, content, None, str(path), remember=False)
    if verbose:
        print(f"fastdiff: imported raw tuning {path} into {cache}: "
              f"{counts['blocks_added']} GEMM/conv shape(s), {counts['local_added']} "
              f"single-key benchmark(s), {counts['best_configs_added']} best config(s) added, "
              f"{counts['blocks_kept'] + counts['best_configs_kept']} already there")
    return {"path": str(path), "cache": str(cache), **counts}


def _this_gpu() -> tuple[int | None, list[int] | None]:
    import torch

    if not torch.cuda.is_available():
        return None, None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.multi_processor_count, [props.major, props.minor]
