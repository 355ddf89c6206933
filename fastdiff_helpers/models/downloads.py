"""Downloads: which weight files a load fetches in its dtype, and how many bytes, said before
they start with the disk checked (say_download). Introduced in 00_setup.ipynb."""

from __future__ import annotations

import os

from ..errors import FastdiffError
from .dtypes import fp32_or_half
from .presets import HUB_FILES, MODELS, VAES
from .hub import (cached, check_cache_folder, file_sizes, free_bytes, offline, weight_files,
                  weight_kinds)

GB = 1e9


def repo_folders(model: str):
    """(hub id, {folder: Component}) of a model key or a VAE swap key ("fp16-fix": the repo's
    root is its one folder)."""
    if model in VAES:
        hub_id, full, _ = VAES[model]
        return hub_id, {"": full}
    if model in MODELS:
        return MODELS[model].hub_id, MODELS[model].full
    raise FastdiffError(f"Unknown model {model!r}. Known: {', '.join(sorted(MODELS))}, and the "
                        f"VAE {', '.join(VAES)}.")


def wanted_variant(hub_id: str, dtype) -> str | None:
    """"fp16" where a load in `dtype` takes the repository's fp16 files (a half-precision load
    of a repo that has them, presets.HUB_FILES), else None (its plain files)."""
    _, has_fp16 = HUB_FILES.get(hub_id, ("fp32", False))
    return "fp16" if has_fp16 and fp32_or_half(dtype) == "half" else None


def local_variant(model: str, path: str, dtype) -> str | None:
    """The variant to load from a local pipeline folder (`path`, or a cached snapshot): the
    wanted one where a safetensors file of it is in any of the model's folders there
    (diffusers' _identify_model_variants asks the same of the folder it loads)."""
    hub_id, comps = repo_folders(model)
    variant = wanted_variant(hub_id, dtype)
    there = variant and any(variant in weight_kinds(os.path.join(path, c)) for c in comps)
    return variant if there else None


def check_disk(nbytes: int, what: str) -> str:
    """Refuse, before it starts, a download of `nbytes` that the Hugging Face cache's disk
    cannot hold, saying what to do; else where it goes: "into FOLDER (N GB free)"."""
    folder = check_cache_folder()
    free = free_bytes(folder)
    if nbytes > free:
        raise FastdiffError(
            f"{what} needs {nbytes / GB:.1f} GB, but the disk of the Hugging Face cache "
            f"({folder}) has {free / GB:.1f} GB free. Free some space, or point HF_HUB_CACHE "
            "(or HF_HOME) at a bigger disk before starting Python, or load with "
            "weights='random' (no download).")
    return f"into {folder} ({free / GB:.0f} GB free)"


def say_download(model: str, dtype, verbose: bool = True) -> str | None:
    """Before a load of `model` (or the "fp16-fix" VAE) from the hub: say what it downloads
    (which files, how many GB; always, `verbose` or not) and check the disk; returns the variant
    to load (None: plain files). Online: the hub's file list and sizes (hub.file_sizes) against
    the local cache. Offline or unreachable: nothing can download; the variant is the wanted one
    where the cache holds its files, else the plain files (loaded, then cast)."""
    hub_id, comps = repo_folders(model)
    wanted = wanted_variant(hub_id, dtype)
    try:
        sizes = None if offline() else file_sizes(hub_id)
    except Exception:  # unreachable, refused, gated: what is cached decides, said below
        sizes = None
    files: dict[str, int] = {}  # to download, name: bytes
    if sizes is None:
        found = cached(hub_id, "config.json" if "" in comps else "model_index.json")
        variant = found and local_variant(model, os.path.dirname(found), dtype)
    else:
        names, variant = weight_files(sizes, set(comps), wanted)
        files = {f: sizes[f] for f in names if cached(hub_id, f) is None}
    if files:
        kind = "fp16" if variant else HUB_FILES.get(hub_id, ("fp32", 0))[0]
        what = f"{model} ({hub_id}, its {kind} files)"
        where = check_disk(sum(files.values()), f"Downloading {what}")
        print(f"fastdiff: downloading {what}: {len(files)} file(s), "
              f"{sum(files.values()) / GB:.1f} GB, {where}")
    elif verbose and wanted and variant is None:
        print(f"fastdiff: {model}: its fp16 files are not here; loading its cached "
              f"{HUB_FILES[hub_id][0]} files and casting them")
    return variant
