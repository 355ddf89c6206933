"""A GPU slot's by-hand fallback, read back: a tarball of what an inductor cache folder held
(`<model>.cache-raw.tgz`, tools/gpu_slot.sh brings one back after every command), imported
like a bundle where its timings file is this machine's. compiletime/tuning.py's import_matching
takes these first.

Introduced in 06_cold_start.ipynb (with the bundles it stands in for).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import PurePosixPath
from typing import Any

from .. import checks
from ..errors import FastdiffError
from .tuning_cache import _cache_folder, _put
from .tuning_data import _safe_relative, split_timings
from .tuning_kinds import raw_kind_problems
from ..techniques.autotune import seed

__all__ = ["import_raw"]


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
    design, compiletime/tuning_kinds.py: its name in the file's own system record, its SM count
    and capability known and equal to this GPU's, the same triton and CUDA); refused otherwise,
    before anything is written. Recorded as a seed (techniques/autotune.py seeded_from).
    """
    from torch._inductor.codecache import CacheBase

    here_system = CacheBase.get_system()
    system_hash = here_system["hash"]
    refused: list[str] = []
    path = checks.existing_file("path", path, "a tarball of an inductor cache folder's "
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
                if not (is_timings or _safe_relative(rel.as_posix())):
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
    cache = _cache_folder(cache_dir)
    counts = _put(cache, system_hash, content, None, str(path), remember=False)
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
