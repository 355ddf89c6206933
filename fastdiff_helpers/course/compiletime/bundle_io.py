"""A tuning bundle exported from the compile cache, imported into it (what it covers registered
for the autotune rule, course/planning/tuning_state.py), every matching one imported, and shown.
The format is bundle.py's; the cache folder's side, bundle_cache.py's.

Introduced in 05_cold_start.ipynb.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ...errors import FastdiffError
from ..planning.tuning_state import STATE, cover, seed, seeded_from
from .bundle import (FORMAT, MUST_MATCH, blocks, check_bundle_path, cross_kind_problems,
                     differences, merge_gemm, merge_local, read_bundle, tuning_stamp)
from .bundle_cache import add_to_cache, cache_folder, import_raw, read_cache_parts
from ..planning.writes import write_atomic

# the states of a run's step whose compile ended with its tuning in the cache
FINISHED = ("measured", "tuned", "warmed")

__all__ = ["export_tuning", "import_tuning", "register_coverage", "import_matching",
           "show_tuning"]


def _refuse_stamp(path: Any, stamp: dict, here: dict, doing: str) -> None:
    found = differences(stamp, here)
    if found:
        raise FastdiffError(f"{path} was tuned on another setup ({'; '.join(found)}), so "
                            f"{doing}. Tune on this machine (python -m fastdiff_helpers warm) "
                            "or use the bundle of this GPU kind and torch build.")


def _write_gzip_json(path: Path, content: dict) -> bytes:
    data = gzip.compress(json.dumps(content, sort_keys=True).encode(), mtime=0)
    write_atomic(path, data)
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
    for (op, key, precision), block in blocks(gemm):
        source = STATE.imported.get((op, key, precision))
        if model is not None and source and source[0] != model and source[1] == block:
            continue
        kept.setdefault(op, {}).setdefault(key, {})[precision] = block
    mine = {rel: c for rel, c in best.items() if not _theirs(model, STATE.imported_best, rel, c)}
    singles = {k: v for k, v in local.items() if not _theirs(model, STATE.imported_local, k, v)}
    return kept, mine, singles


def export_tuning(path: str | os.PathLike, model: str | None = None,
                  cache_dir: str | os.PathLike | None = None, drop: tuple[str, ...] = (),
                  run: dict | None = None, verbose: bool = True, if_any: bool = False
                  ) -> dict[str, Any] | None:
    """Write (or grow) the tuning bundle at `path` from the compile cache (default: the
    course's, fdh.course.use_course_cache): the GEMM/convolution timings of this machine and the
    single-key benchmarks beside them (pad_mm's), and the Triton best configs, stamped
    (tuning_stamp). An existing bundle is merged with, block by
    block (one (op, input key, precision) block is one run's, never mixed), and must carry
    this machine's stamp; a file that is not a bundle is never overwritten. `model`: leave
    out what another model's bundle brought unchanged. `drop`: best configs (relative paths)
    to leave out, e.g. the provisional one of a kernel cut mid-descent. `run`: a record of
    the command that tuned (its id replaces the same id's record). `if_any`: write nothing,
    return None, when there is no tuning data to write. Prints the SHA-256 with `verbose`.
    Returns the bundle's summary (counts, bytes, sha256, path).
    Introduced in docs/instructor.md."""
    from torch._inductor.codecache import CacheBase

    out = check_bundle_path("path", path)
    cache = cache_folder(cache_dir)
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
    precisions = sorted({p for (_, _, p), _ in blocks(merged)})
    seeds = [dict(e) for e in (old or {}).get("seeded_from", [])]
    seeds += [e for e in seeded_from(model) if e not in seeds]
    content = {"format": FORMAT, "stamp": here, "model": model if model else
               (old or {}).get("model"), "fp32_precisions": precisions, "gemm": merged,
               "local": singles, "best_configs": best_all, "runs": runs,
               "seeded_from": seeds}
    data = _write_gzip_json(out, content)
    summary = {"path": str(out), "gemm_blocks": sum(1 for _ in blocks(merged)),
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
    other part of the stamp equal; course/compiletime/bundle.py says why that holds). Its
    tuning is taken and recorded: a bundle exported here lists it in "seeded_from", and every
    result measured from it says "tuned on the <kind>". Never implied: a bundle of another kind
    without from_kind is refused, and from_kind is refused across SM counts or capabilities.
    Introduced in docs/instructor.md."""
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
    cache = cache_folder(cache_dir)
    counts = add_to_cache(cache, here["system_hash"], bundle, bundle.get("model"), source)
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
    """Tell the autotune rule (course/planning/tuning_state.py) what `bundle` holds finished: every
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


def show_tuning(path: str | os.PathLike) -> str:
    """What a bundle holds, as text: its stamp, shapes per op, best configs (and how many
    coordinate descent found), the commands that tuned and their seconds, its SHA-256.
    Introduced in docs/instructor.md."""
    bundle = read_bundle(path)
    ops: dict[str, int] = {}
    for (op, _, _), _ in blocks(bundle["gemm"]):
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
    for seeded in bundle.get("seeded_from", []):
        lines.append(f"seeded from another GPU kind: tuned on the {seeded.get('gpu_name')} "
                     f"({seeded.get('source')})")
    lines.append(f"commands that tuned: {len(tuned)} of {len(runs)}, "
                 f"{sum(r.get('wall_s') or 0 for r in tuned):.0f} s in all")
    for r in runs:
        lines.append(f"  {r.get('started_at', '?')} {r.get('state', '?')}: {r.get('wall_s', 0):.0f} s,"
                     f" {r.get('autotunes', 0)} autotune(s), {r.get('coordesc_benches', 0)} "
                     f"coordinate-descent benchmark(s): {r.get('command', '')}")
    return "\n".join(lines)
