"""A tuning bundle's format: max-autotune's results carried between machines of one GPU kind as
a small gzip'd JSON file, never as code. Its stamp (what the tuning is valid for), how it is read
and checked (gzip and json alone: nothing in it runs), how two sets of timings merge, where the
course keeps it, and when another GPU kind of one design may take it. bundle_io.py exports and
imports bundles; bundle_cache.py reads and fills an inductor cache folder.

Introduced in 05_cold_start.ipynb. Inductor already keeps what tuning found, as JSON, in its
cache folder (torch 2.13):
- GEMM and convolution timings, every choice of every shape: `<cache>/cache/<system hash>`
  (torch/_inductor/codecache.py, PersistentCache.lookup; the file name is a hash of the GPU
  name, triton and CUDA versions, CacheBase.get_system). A shape whose every choice is there
  is not benchmarked again: the winner is picked from the stored timings.
- beside them in that file, single-key benchmarks (LocalCache.set_value with one key):
  pad_mm's pad-or-not benchmarks (torch/_inductor/fx_passes/pad_mm.py, get_pad_cache: "base mm
  time: ..." -> ms, the padded key -> bool; looked up before benchmarking again,
  get_cached_should_pad) and the scheduler's runtime benchmarks (scheduler.py,
  get_estimate_runtime_cache).
- the best config of each Triton kernel, coordinate descent's included: `<cache>/<xx>/<key>
  .best_config` (torch/_inductor/runtime/autotune_cache.py; the key includes torch_key(),
  AutotuneCache._make_local_cache_key), read when the kernel loads.
A bundle holds all three, stamped; import checks the stamp, then puts them into this machine's
cache folder before the first compile, so a bare machine compiles without tuning.
torch.compiler.save_cache_artifacts (the "mega-cache", course/compiletime/cold_start.py) lacks the
GEMM timings, cannot be written by a killed process, and holds pickled code. A bundle (gzip'd JSON):
    {"format": "fastdiff-tuning 1", "stamp": {...}, "model": "sdxl",
     "fp32_precisions": ["high"], "gemm": {op: {input key: {precision: {choice: ms}}}},
     "local": {key: ms or bool}, "best_configs": {"<xx>/<key>.best_config": {...}},
     "runs": [{the commands that tuned}]}
"gemm" keeps inductor's own nesting; a bundle without "local" (none was written before) reads
as holding none.

Another GPU kind of one design: inductor's kernels and their keys depend on the device only
through its DeviceProperties (torch/_inductor/runtime/hints.py: type, index, SM count, compute
capability, registers and threads per SM, threads per block, warp size), which an H100 SXM and
an H200 share (both a GH100 with 132 SMs, compute capability 9.0); the GPU's name enters only
the timings file's name, inductor's system hash (codecache.py CacheBase.get_system: the name,
triton's key and the CUDA version). The timings are another card's: an H200's memory is faster,
so a shape's winner may differ by a little; that is why such an import is explicit (from_kind)
and every result measured with it says where its tuning came from.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from ... import checks
from ...errors import FastdiffError
from ...measure.env import cpu_name, device_name

__all__ = ["FORMAT", "MUST_MATCH", "KNOWN_KINDS", "tuning_stamp", "bundle_path",
           "check_bundle_path", "read_bundle", "split_timings", "blocks",
           "safe_relative", "differences", "cross_kind_problems", "raw_kind_problems",
           "merge_gemm", "merge_local"]


FORMAT = "fastdiff-tuning 1"
# what must be equal between the machine that tuned and the one that imports
MUST_MATCH = ("torch", "triton", "cuda", "gpu_name", "sm_count", "capability", "cpu",
              "system_hash", "torch_key")
def gpu_folder(device: Any) -> str:
    """The results folder name of a device: its name in lower case, words joined by "-",
    without the vendor ("NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3")."""
    name = re.sub(r"^(nvidia|amd|intel)\s+", "", device_name(device).strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


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
    Introduced in docs/instructor.md."""
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


def bundle_path(model: str, device: str | None = None, root: str | os.PathLike = "results"
                ) -> Path:
    """Where the course keeps a model's bundle: <root>/<gpu>/tuning/<torch>/<model>.json.gz,
    e.g. results/h100-80gb-hbm3/tuning/2.11.0+cu130/sdxl.json.gz.
    Introduced in docs/instructor.md."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Path(root) / gpu_folder(device) / "tuning" / torch.__version__ / f"{model}.json.gz"


def check_bundle_path(name: str, path: str | os.PathLike) -> Path:
    """A path a bundle may be written to: new, or a gzip file (read_bundle then checks that it
    is a bundle of this machine's); any other file is left as it is (refused)."""
    return checks.output_file(name, path, "sdxl.json.gz", lambda p: checks.file_starts(
        p, b"\x1f\x8b"), "a tuning bundle (gzip'd JSON written by fdh.course.export_tuning)")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value))


def safe_relative(rel: str) -> bool:
    """A path inside the cache folder: relative, no '..', no backslash, a .best_config."""
    path = PurePosixPath(rel)
    return (isinstance(rel, str) and rel.endswith(".best_config") and "\\" not in rel
            and not path.is_absolute() and ":" not in path.parts[0]
            and all(part not in ("", ".", "..") for part in path.parts))


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


def blocks(gemm: dict):
    for op, keys in gemm.items():
        for key, precisions in keys.items():
            for precision, block in precisions.items():
                yield (op, key, precision), block


def _check_bundle(bundle: Any, where: str) -> dict:
    """Refuse a bundle whose shape is not this format's, naming what is wrong."""
    def bad(what: str) -> FastdiffError:
        return FastdiffError(f"{where} is not a fastdiff tuning bundle ({what}): give a file "
                             "written by fdh.course.export_tuning or `python -m fastdiff_helpers "
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
    for (op, key, precision), block in blocks(gemm):
        if not _is_block(block):
            raise bad(f"the timings of {op} {key[:40]} {precision} are not choice: ms")
    local = bundle.get("local", {})
    if not isinstance(local, dict) or not all(
            isinstance(v, bool) or _is_number(v) for v in local.values()):
        raise bad("local must map keys to a number or true/false")
    for rel, config in best.items():
        if not safe_relative(rel):
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
    path = checks.existing("path", path, "a tuning bundle (.json.gz) written by "
                           "fdh.course.export_tuning")
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
                            "written by fdh.course.export_tuning.") from None
    return dict(_check_bundle(bundle, str(path)), sha256=digest, bytes=len(data))


def differences(stamp: dict, here: dict) -> list[str]:
    """What differs between a bundle's stamp and this machine's, one phrase each."""
    return [f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}" for key in MUST_MATCH
            if stamp.get(key) != here.get(key)]


# (SM count, compute capability) of the kinds the course has met, for a raw tarball (which
# carries the GPU's name, not its properties). NVIDIA's H100 Tensor Core GPU Architecture
# whitepaper: H100 SXM5 132 SMs, H100 PCIe 114; the H200 is the same GH100 configuration as
# the H100 SXM5; all compute capability 9.0.
KNOWN_KINDS: dict[str, tuple[int, tuple[int, int]]] = {
    "NVIDIA H100 80GB HBM3": (132, (9, 0)),
    "NVIDIA H200": (132, (9, 0)),
    "NVIDIA H100 PCIe": (114, (9, 0)),
}
# the stamp's fields that may differ between two kinds of one design (MUST_MATCH's others may
# not): the name, and the timings file's name derived from it
ACROSS_KINDS = ("gpu_name", "system_hash")


def cross_kind_problems(stamp: dict, here: dict, must_match: tuple[str, ...]) -> list[str]:
    """Why a bundle stamped `stamp` may not seed this machine (`here`), one phrase each; empty
    when it may: another GPU name, the same SM count and compute capability, everything else
    of the stamp equal."""
    problems = []
    if stamp.get("gpu_name") is None or here.get("gpu_name") is None:
        problems.append("a seed goes from one GPU to another (this stamp has none)")
    elif stamp.get("gpu_name") == here.get("gpu_name"):
        problems.append(f"the bundle is of this kind ({here['gpu_name']}): import it without "
                        "from_kind")
    for key in ("sm_count", "capability"):
        if stamp.get(key) is None or stamp.get(key) != here.get(key):
            problems.append(f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}")
    problems += [f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}"
                 for key in must_match if key not in ACROSS_KINDS + ("sm_count", "capability")
                 and stamp.get(key) != here.get(key)]
    return problems


def raw_kind_problems(system: Any, here_system: dict, from_kind: str, sm_count: int | None,
                      capability: list[int] | None) -> list[str]:
    """Why a raw timings file (its inductor "system" record) of GPU kind `from_kind` may not
    seed this machine (its system record, SM count and capability); empty when it may."""
    if not isinstance(system, dict):
        return ["the timings file has no system record"]
    name = (system.get("device") or {}).get("name")
    problems = []
    if name != from_kind:
        problems.append(f"its GPU is {name!r}, not {from_kind!r}")
    if from_kind not in KNOWN_KINDS:
        problems.append(f"{from_kind!r} is not a kind whose SM count the course knows "
                        f"({', '.join(KNOWN_KINDS)})")
    elif KNOWN_KINDS[from_kind] != (sm_count, tuple(capability or ())):
        sms, cc = KNOWN_KINDS[from_kind]
        problems.append(f"{from_kind} has {sms} SMs and compute capability {cc}, this GPU "
                        f"{sm_count} and {tuple(capability or ())}")
    if system.get("version") != here_system.get("version"):
        problems.append("its triton or CUDA is not this machine's")
    return problems


def merge_gemm(old: dict, new: dict) -> tuple[dict, int]:
    """`old` with every (op, input key, precision) block of `new` put in whole: a block is one
    run's timings of one shape, never mixed with another run's. Returns (merged, blocks new
    or changed)."""
    merged = json.loads(json.dumps(old))
    changed = 0
    for (op, key, precision), block in blocks(new):
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
