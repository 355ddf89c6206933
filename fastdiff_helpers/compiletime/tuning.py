"""max-autotune's tuning as data: the results of autotuning, carried between machines of one
GPU kind as a small gzip'd JSON bundle, never as code.

Introduced in 06_cold_start.ipynb. Inductor already keeps what tuning found, as JSON, in its
cache folder (torch 2.13):
- GEMM and convolution timings, every choice of every shape: `<cache>/cache/<system hash>`
  (torch/_inductor/codecache.py, PersistentCache.lookup; the file name is a hash of the GPU
  name, triton and CUDA versions, CacheBase.get_system). A shape whose every choice is there
  is not benchmarked again: the winner is picked from the stored timings.
- beside them in that file, single-key benchmarks (pad_mm's pad-or-not timings, the
  scheduler's runtime benchmarks: LocalCache.set_value with one key), looked up before
  benchmarking again (torch/_inductor/fx_passes/pad_mm.py, get_cached_should_pad).
- the best config of each Triton kernel, coordinate descent's included: `<cache>/<xx>/<key>
  .best_config` (torch/_inductor/runtime/autotune_cache.py; the key includes torch_key(),
  AutotuneCache._make_local_cache_key), read when the kernel loads.
A bundle holds both, stamped with what they are valid for; import checks the stamp, then puts
them into this machine's cache folder before the first compile, so a bare machine compiles
without tuning. torch.compiler.save_cache_artifacts (the "mega-cache", compiletime/cold_start.py)
lacks the GEMM timings, cannot be written by a killed process, and holds pickled code.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .. import checks
from ..errors import FastdiffError
from ..techniques.autotune import cover, seed, seeded_from
from ..measure.env import gpu_folder
from .tuning_cache import _IMPORTED, _IMPORTED_BEST, _IMPORTED_LOCAL, _cache_folder, _put
from .tuning_kinds import cross_kind_problems
from .tuning_data import (FORMAT, MUST_MATCH, _blocks, differences, merge_gemm, merge_local,
                          read_bundle, read_cache, read_cache_parts, show_tuning, tuning_stamp)
from .tuning_raw import import_raw

# the states of a run's step whose compile ended with its tuning in the cache
FINISHED = ("measured", "tuned", "warmed")

__all__ = ["export_tuning", "import_tuning", "show_tuning", "tuning_stamp", "bundle_path",
           "import_matching", "read_bundle", "read_cache"]



def bundle_path(model: str, device: str | None = None, root: str | os.PathLike = "results"
                ) -> Path:
    """Where the course keeps a model's bundle: <root>/<gpu>/tuning/<torch>/<model>.json.gz,
    e.g. results/h100-80gb-hbm3/tuning/2.11.0+cu130/sdxl.json.gz.
    Introduced in 06_cold_start.ipynb."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Path(root) / gpu_folder(device) / "tuning" / torch.__version__ / f"{model}.json.gz"


def check_bundle_path(name: str, path: str | os.PathLike) -> Path:
    """A path a bundle may be written to: new, or a gzip file (read_bundle then checks that it
    is a bundle of this machine's); any other file is left as it is (refused)."""
    return checks.output_file(name, path, "sdxl.json.gz", lambda p: checks.file_starts(
        p, b"\x1f\x8b"), "a tuning bundle (gzip'd JSON written by fdh.export_tuning)")


def _refuse_stamp(path: Any, stamp: dict, here: dict, doing: str) -> None:
    found = differences(stamp, here)
    if found:
        raise FastdiffError(f"{path} was tuned on another setup ({'; '.join(found)}), so "
                            f"{doing}. Tune on this machine (python -m fastdiff_helpers warm) "
                            "or use the bundle of this GPU kind and torch build.")


def _write_gzip_json(path: Path, content: dict) -> bytes:
    data = gzip.compress(json.dumps(content, sort_keys=True).encode(), mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a killed write never leaves half a bundle under the real name
    return data


def _theirs(model: str | None, imported: dict, key: Any, value: Any) -> bool:
    """`value` came into this process with another model's bundle and is unchanged."""
    return (model is not None and key in imported and imported[key][0] != model
            and imported[key][1] == value)


def _ours(model: str | None, gemm: dict, best: dict, local: dict
          ) -> tuple[dict, dict, dict]:
    """What of a cache belongs in `model`'s bundle: all of it, less what another model's
    bundle brought into this process and is still unchanged."""
    kept: dict = {}
    for (op, key, precision), block in _blocks(gemm):
        source = _IMPORTED.get((op, key, precision))
        if model is not None and source and source[0] != model and source[1] == block:
            continue
        kept.setdefault(op, {}).setdefault(key, {})[precision] = block
    mine = {rel: c for rel, c in best.items() if not _theirs(model, _IMPORTED_BEST, rel, c)}
    singles = {k: v for k, v in local.items() if not _theirs(model, _IMPORTED_LOCAL, k, v)}
    return kept, mine, singles


def export_tuning(path: str | os.PathLike, model: str | None = None,
                  cache_dir: str | os.PathLike | None = None, drop: tuple[str, ...] = (),
                  run: dict | None = None, verbose: bool = True, if_any: bool = False
                  ) -> dict[str, Any] | None:
    """Write (or grow) the tuning bundle at `path` from the compile cache (default: the
    course's, fdh.use_course_cache): the GEMM/convolution timings of this machine and the
    single-key benchmarks beside them (pad_mm's), and the Triton best configs, stamped
    (tuning_stamp). An existing bundle is merged with, block by
    block (one (op, input key, precision) block is one run's, never mixed), and must carry
    this machine's stamp; a file that is not a bundle is never overwritten. `model`: leave
    out what another model's bundle brought unchanged. `drop`: best configs (relative paths)
    to leave out, e.g. the provisional one of a kernel cut mid-descent. `run`: a record of
    the command that tuned (its id replaces the same id's record). `if_any`: write nothing,
    return None, when there is no tuning data to write. Prints the SHA-256 with `verbose`.
    Returns the bundle's summary (counts, bytes, sha256, path).
    Introduced in 06_cold_start.ipynb."""
    from torch._inductor.codecache import CacheBase

    out = check_bundle_path("path", path)
    cache = _cache_folder(cache_dir)
    gemm, local, best = read_cache_parts(cache, CacheBase.get_system()["hash"])
    gemm, best, local = _ours(model, gemm, best, local)
    for rel in drop:
        best.pop(rel, None)
    old = read_bundle(out) if out.exists() else None
    if old is None and not gemm and not best and not local and if_any:
        return None  # before the stamp: torch_key() hashes torch's sources (seconds)
    here = tuning_stamp()
    if old is not None:
        _refuse_stamp(out, old["stamp"], here, "this machine's tuning cannot be added to it")
    if old is None and not gemm and not best and not local:
        raise FastdiffError(f"{cache} holds no tuning data (no GEMM timings, no Triton best "
                            "config): compile with mode='max-autotune' first (on a GPU; on a "
                            "CPU inductor tunes only with freezing and the CPP backend).")
    merged, changed = merge_gemm(old["gemm"] if old else {}, gemm)
    singles, singles_changed = merge_local(old.get("local", {}) if old else {}, local)
    best_all = dict(old["best_configs"] if old else {})
    best_changed = sum(best_all.get(rel) != c for rel, c in best.items())
    best_all.update(best)
    runs = [r for r in (old["runs"] if old else []) if not run or r.get("id") != run.get("id")]
    if run:
        runs.append(run)
    precisions = sorted({p for (_, _, p), _ in _blocks(merged)})
    seeds = [dict(e) for e in (old or {}).get("seeded_from", [])]
    seeds += [e for e in seeded_from(model) if e not in seeds]
    content = {"format": FORMAT, "stamp": here, "model": model if model else
               (old or {}).get("model"), "fp32_precisions": precisions, "gemm": merged,
               "local": singles, "best_configs": best_all, "runs": runs,
               "seeded_from": seeds}
    data = _write_gzip_json(out, content)
    summary = {"path": str(out), "gemm_blocks": sum(1 for _ in _blocks(merged)),
               "best_configs": len(best_all), "blocks_added": changed,
               "local_entries": len(singles), "local_added": singles_changed,
               "best_configs_added": best_changed, "bytes": len(data),
               "sha256": hashlib.sha256(data).hexdigest()}
    if verbose:
        print(f"fastdiff: tuning bundle {out}: {summary['gemm_blocks']} GEMM/conv shape(s) "
              f"({changed} new), {len(singles)} single-key benchmark(s) ({singles_changed} new), "
              f"{len(best_all)} best config(s) ({best_changed} new), "
              f"{len(data) / 1024:.1f} KiB, SHA-256 {summary['sha256']}")
    return summary


def import_tuning(path: str | os.PathLike, sha256: str | None = None,
                  cache_dir: str | os.PathLike | None = None, verbose: bool = True,
                  from_kind: str | None = None) -> dict[str, Any]:
    """Put a bundle's tuning into the compile cache (default: the course's folder, chosen
    first) before the first compile: shapes and kernels this cache does not hold yet are
    added, what it holds is kept. Refused, before anything is written, when `sha256` is given
    and does not match, or when the bundle's stamp is not this machine's (each difference
    named). Every path stays inside the cache folder. Returns what was imported.

    `from_kind`: the GPU the bundle was tuned on, when it is another kind of the same design as
    this one (an H200's bundle on an H100 SXM: the same SM count and compute capability, every
    other part of the stamp equal; compiletime/tuning_kinds.py says why that holds). Its
    tuning is taken and recorded: a bundle exported here lists it in "seeded_from", and every
    result measured from it says "tuned on the <kind>". Never implied: a bundle of another kind
    without from_kind is refused, and from_kind is refused across SM counts or capabilities.
    Introduced in 06_cold_start.ipynb."""
    bundle = read_bundle(path, sha256)
    here = tuning_stamp()
    source = str(path)
    if from_kind is None:
        _refuse_stamp(path, bundle["stamp"], here, "its timings would not describe this machine")
    else:
        problems = cross_kind_problems(bundle["stamp"], here, MUST_MATCH)
        if bundle["stamp"].get("gpu_name") != from_kind:
            problems.insert(0, f"it was tuned on {bundle['stamp'].get('gpu_name')!r}, not "
                               f"{from_kind!r}")
        if problems:
            raise FastdiffError(f"{path} cannot seed this GPU from {from_kind}: "
                                f"{'; '.join(problems)}. Nothing was imported.")
        source = f"{path} (tuned on the {from_kind})"
        seed(bundle.get("model"), from_kind, str(path))
    cache = _cache_folder(cache_dir)
    counts = _put(cache, here["system_hash"], bundle, bundle.get("model"), source)
    covered = register_coverage(bundle, source)
    summary = {"path": str(path), "cache": str(cache), "sha256": bundle["sha256"],
               "model": bundle.get("model"), "covers": covered, **counts}
    if verbose:
        print(f"fastdiff: imported tuning {source} ({bundle.get('model') or 'no model'}, SHA-256 "
              f"{bundle['sha256'][:16]}...) into {cache}: {counts['blocks_added']} GEMM/conv "
              f"shape(s) and {counts['best_configs_added']} best config(s) added "
              f"({counts['local_added']} single-key benchmark(s) beside them), "
              f"{counts['blocks_kept'] + counts['best_configs_kept']} already there")
    return summary


def register_coverage(bundle: dict, source: str) -> int:
    """Tell the autotune rule (techniques/autotune.py) what `bundle` holds finished: every
    coverage key a step of its runs recorded when its compile ended (TuningWatch.note_step's
    covers: measured, tuned or warmed), so that a compile it covers may read its tuning on a
    GPU with autotuning off. Returns how many keys were registered."""
    keys = {key for run in bundle.get("runs", []) for step in run.get("steps", {}).values()
            if isinstance(step, dict) and step.get("state") in FINISHED
            for key in step.get("covers", []) if isinstance(key, str)}
    for key in keys:
        cover(key, source)
    return len(keys)


def import_matching(root: str | os.PathLike = "results", cache_dir=None, verbose: bool = True
                    ) -> list[dict[str, Any]]:
    """Import every bundle under <root>/*/tuning/<this torch>/ whose stamp is this machine's
    (the committed ones); the others are left, and with `verbose` said, once each. Raw
    tarballs there (`*.cache-raw.tgz`, import_raw) go first, where one is this machine's."""
    import torch

    raw = sorted(Path(root).glob(f"*/tuning/{torch.__version__}/*.cache-raw.tgz"))
    done = [d for d in (import_raw(path, cache_dir=cache_dir, verbose=verbose) for path in raw)
            if d is not None]
    found = sorted(Path(root).glob(f"*/tuning/{torch.__version__}/*.json.gz"))
    if not found:
        return done
    here = tuning_stamp()
    for path in found:
        try:
            bundle = read_bundle(path)
        except FastdiffError as exc:
            if verbose:
                print(f"fastdiff: not importing {path}: {exc}")
            continue
        if differences(bundle["stamp"], here):
            continue  # another GPU kind's bundle: silently not ours
        done.append(import_tuning(path, cache_dir=cache_dir, verbose=verbose))
    return done
