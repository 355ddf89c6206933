"""Downloads: which weight files a load fetches, in the load's dtype, and how many bytes, said
before they start, with the cache's free disk checked.

Introduced in 00_setup.ipynb (the first load that downloads says what and how many GB).
A half-precision load (fp16, bf16) fetches a repository's fp16 files where it has them
(presets.HUB_FILES, checked against the hub's own file list when online); an fp32 load its
plain files. Which files from_pretrained takes per folder is diffusers' own choice
(pipeline_loading_utils.py variant_compatible_siblings: the variant's files where a folder has
them, else its plain ones; none at all raises ValueError, pipeline_utils.py DiffusionPipeline
.from_pretrained, "no such modeling files"), so load_pipeline asks for the variant only where
the repository has it. huggingface_hub and diffusers are imported inside the functions.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from ..errors import FastdiffError
from .dtypes import DTYPES, element_bytes, fp32_or_half, weight_name
from .fit import part_parameters
from .presets import HUB_FILES, MODELS, VAES

# what from_pretrained(use_safetensors=True) leaves out (pipeline_loading_utils.py
# _get_ignore_patterns)
IGNORED = ["*.bin", "*.msgpack", "*.onnx", "*.pb"]
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


def _dtype_name(dtype) -> str:
    name = weight_name(str(dtype).removeprefix("torch."))
    name = {str(v).removeprefix("torch."): k for k, v in DTYPES.items()}.get(name, name)
    if name not in DTYPES:
        raise FastdiffError(f"Unknown dtype {dtype!r}: use fp32, bf16 or fp16.")
    return name


def wanted_variant(hub_id: str, dtype) -> str | None:
    """"fp16" where a load in `dtype` takes the repository's fp16 files (a half-precision load
    of a repo that has them, presets.HUB_FILES), else None (its plain files)."""
    _, has_fp16 = HUB_FILES.get(hub_id, ("fp32", False))
    return "fp16" if has_fp16 and fp32_or_half(_dtype_name(dtype)) == "half" else None


def files_dtype(model: str, dtype) -> str:
    """The dtype of the files a load of `model` in `dtype` fetches: "fp16" for the fp16
    variant, else the repository's plain files' ("fp32"; "bf16" for Flux)."""
    hub_id, _ = repo_folders(model)
    return "fp16" if wanted_variant(hub_id, dtype) else HUB_FILES.get(hub_id, ("fp32", 0))[0]


def download_bytes(model: str, dtype: str) -> int:
    """The bytes of the safetensors files from_pretrained fetches for `model` (a key of
    fdh.MODELS, or "fp16-fix" for that VAE) loaded in `dtype`: parameters of the full-size
    architecture times the bytes per element of the files' dtype (a safetensors file is the
    raw tensors plus a header of a few hundred kB, left out). Offline, from the meta device;
    what the download command and the plan count."""
    return element_bytes(files_dtype(model, dtype)) * sum(part_parameters(model).values())


def weight_files(names, folders, variant: str | None) -> tuple[list[str], str | None]:
    """The safetensors files (and shard indexes) from_pretrained loads from a repository whose
    files are `names`, for the weight `folders` ("" for a repo's root), by diffusers' own
    choice; and the variant to pass it (None where the repo has no file of `variant`)."""
    from diffusers.pipelines.pipeline_loading_utils import variant_compatible_siblings

    mine = [n for n in names if (n.rpartition("/")[0] in folders)]
    try:
        chosen, _ = variant_compatible_siblings(mine, variant=variant, ignore_patterns=IGNORED)
    except ValueError:  # no file of the variant at all: from_pretrained would refuse it
        if variant is None:
            raise
        chosen, _ = variant_compatible_siblings(mine, variant=None, ignore_patterns=IGNORED)
        variant = None
    return sorted(f for f in chosen if f.endswith((".safetensors", ".json"))), variant


def _cached(hub_id: str, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, filename), str)


def has_variant(root: str, folders, variant: str) -> bool:
    """Whether the folder `root` (a cached snapshot, a local pipeline folder) holds a
    safetensors file of `variant` in any of `folders` (diffusers' _identify_model_variants
    asks the same of the folder it loads)."""
    return any(f.split(".")[1:2] == [variant] or f.split(".")[1].startswith(variant + "-")
               for folder in folders if os.path.isdir(os.path.join(root, folder))
               for f in os.listdir(os.path.join(root, folder))
               if f.endswith(".safetensors") and f.count(".") >= 2)


def _has_cached_variant(hub_id: str, folders, variant: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(hub_id, "config.json" if "" in folders
                                   else "model_index.json")
    return isinstance(found, str) and has_variant(os.path.dirname(found), folders, variant)


def local_variant(model: str, path: str, dtype) -> str | None:
    """The variant to load from a local pipeline folder: the wanted one where it is there."""
    hub_id, comps = repo_folders(model)
    variant = wanted_variant(hub_id, dtype)
    return variant if variant and has_variant(path, set(comps), variant) else None


@dataclass
class Download:
    """What a load would fetch: its files (name: bytes) not in the cache yet, the variant it
    loads, and whether the sizes are the hub's (exact) or from the architecture."""

    hub_id: str
    variant: str | None
    files: dict[str, int] = field(default_factory=dict)
    exact: bool = True

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def plan_download(model: str, dtype) -> Download:
    """What loading `model` (or the "fp16-fix" VAE) in `dtype` from the hub would download now.
    Online: the hub's file list and sizes (model_info(files_metadata=True)) against the local
    cache. Offline or unreachable: nothing can download; the variant is the wanted one where
    the cache holds its files, else the plain files (loaded, then cast)."""
    hub_id, comps = repo_folders(model)
    variant = wanted_variant(hub_id, dtype)
    if not hub_offline():
        from huggingface_hub import model_info

        try:
            info = model_info(hub_id, files_metadata=True, timeout=10)
        except Exception:  # unreachable, refused, gated: what is cached decides, said below
            info = None
        if info is not None:
            sizes = {s.rfilename: s.size or 0 for s in info.siblings}
            files, variant = weight_files(sizes, set(comps), variant)
            return Download(hub_id, variant, {f: sizes[f] for f in files
                                              if not _cached(hub_id, f)})
    if variant is not None and not _has_cached_variant(hub_id, set(comps), variant):
        variant = None
    return Download(hub_id, variant, {}, exact=False)


def free_bytes(folder: str) -> int:
    """Free bytes on the disk of `folder` (its nearest existing parent)."""
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def cache_folder() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def check_cache_folder() -> None:
    """Refuse, before any network call, a Hugging Face cache that cannot be a folder: HF_HOME or
    HF_HUB_CACHE naming a regular file (huggingface_hub would fail deep inside with
    NotADirectoryError, or reach the network first), or a folder this user cannot write."""
    from huggingface_hub import constants

    named = next((v for v in ("HF_HUB_CACHE", "HF_HOME") if os.environ.get(v)), None)
    fix = (f"Point {named} at a folder (or unset it) before starting Python." if named else
           "Point HF_HUB_CACHE (or HF_HOME) at a folder before starting Python.")
    for folder in (constants.HF_HOME, constants.HF_HUB_CACHE):
        path = os.path.abspath(folder)
        while not os.path.exists(path):
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            raise FastdiffError(f"The Hugging Face cache {constants.HF_HUB_CACHE} cannot be "
                                f"made: {path} is a file, not a folder. {fix} Nothing was "
                                "downloaded.")
        if not os.access(path, os.W_OK):
            raise FastdiffError(f"The Hugging Face cache {constants.HF_HUB_CACHE} cannot be "
                                f"written: {path} is not writable by this user. {fix} Nothing "
                                "was downloaded.")


def check_online() -> None:
    """Refuse a download in huggingface_hub's offline mode before it asks the hub anything
    (every request raises OfflineModeIsEnabled there: huggingface_hub/utils/_http.py)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise FastdiffError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: huggingface_hub "
                            "is in offline mode and cannot download. Unset it on a machine "
                            "that reaches huggingface.co, or carry a filled cache here "
                            "(`download --dry-run` lists what the course needs). Nothing was "
                            "downloaded.")


def check_disk(nbytes: int, what: str) -> None:
    """Refuse, before it starts, a download of `nbytes` that the Hugging Face cache's disk
    cannot hold, saying what to do."""
    check_cache_folder()
    folder = cache_folder()
    free = free_bytes(folder)
    if nbytes > free:
        raise FastdiffError(
            f"{what} needs {nbytes / GB:.1f} GB, but the disk of the Hugging Face cache "
            f"({folder}) has {free / GB:.1f} GB free. Free some space, or point HF_HUB_CACHE "
            "(or HF_HOME) at a bigger disk before starting Python, or load with "
            "weights='random' (no download).")


def say_download(model: str, dtype, verbose: bool = True) -> str | None:
    """Before a load from the hub: say what it downloads (which files, how many GB; always,
    `verbose` or not) and check the disk; returns the variant to load (None: plain files)."""
    plan = plan_download(model, dtype)
    if plan.files:
        kind = "fp16" if plan.variant else HUB_FILES.get(plan.hub_id, ("fp32", 0))[0]
        what = f"{model} ({plan.hub_id}, its {kind} files)"
        check_disk(plan.bytes, f"Downloading {what}")
        print(f"fastdiff: downloading {what}: {len(plan.files)} file(s), "
                  f"{plan.bytes / GB:.1f} GB, into {cache_folder()} "
                  f"({free_bytes(cache_folder()) / GB:.0f} GB free)")
    elif verbose and wanted_variant(plan.hub_id, dtype) and plan.variant is None:
        print(f"fastdiff: {model}: its fp16 files are not here; loading its cached "
              f"{HUB_FILES[plan.hub_id][0]} files and casting them")
    return plan.variant
