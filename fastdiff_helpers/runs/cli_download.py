"""`python -m fastdiff_helpers download [--notebooks 00 05 ...] [--models sdxl ...]
[--dry-run]`: the weights the course (or the notebooks named) loads, fetched ahead of a
workshop in the dtypes its cells run them in, sizes said first and the disk checked.

Introduced in 00_setup.ipynb. Each repository comes down by huggingface_hub's own
snapshot_download (its progress bars), restricted to the files from_pretrained loads in that
dtype (models/downloads.py weight_files), the configs, tokenizers and scheduler beside them.
"""

from __future__ import annotations

import argparse
import json

from ..models.gpus import PROFILES, gpu_profile
from ..errors import FastdiffError
from ..models.downloads import (GB, cache_folder, check_cache_folder, check_disk, check_online,
                                free_bytes, repo_folders, wanted_variant, weight_files)
from ..models.presets import MODELS, VAES
from ..planning.course_downloads import course_downloads, for_card, table

__all__ = ["add_download_command", "download"]


def add_download_command(sub) -> None:
    p = sub.add_parser("download", help="fetch the weights the course (or the notebooks "
                       "named) loads, in the dtypes it runs them in, ahead of a workshop")
    p.add_argument("--notebooks", nargs="+", default=None, metavar="NN",
                   help="only what these notebooks need (numbers or names; default all)")
    p.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS) + list(VAES),
                   help="only these models")
    p.add_argument("--gpu", choices=list(PROFILES), default=None,
                   help="leave out the files of what does not fit this card (as the plan says)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would come down, and the GB, without downloading")


def _allow_patterns(hub_id: str, folders: dict, variant_dtype: str) -> tuple[list[str], int]:
    """The files from_pretrained fetches for these folders in this dtype, as snapshot_download
    patterns, and their bytes still to download (the hub's sizes)."""
    from huggingface_hub import hf_hub_download, model_info, try_to_load_from_cache

    info = model_info(hub_id, files_metadata=True, timeout=10)
    sizes = {s.rfilename: s.size or 0 for s in info.siblings}
    files, _ = weight_files(sizes, set(folders), wanted_variant(hub_id, variant_dtype))
    if "" in folders:  # one model at the repo's root: its config
        extra = ["config.json"]
    else:  # a pipeline: model_index.json names its folders; the ones without weights whole
        index = json.loads(open(hf_hub_download(hub_id, "model_index.json")).read())
        named = [k for k, v in index.items() if isinstance(v, list) and k != "_class_name"]
        extra = ["model_index.json"] + [f"{k}/config.json" for k in folders]
        extra += [f"{k}/*" for k in named if k not in folders and not any(
            f.startswith(k + "/") and f.endswith((".safetensors", ".bin")) for f in sizes)]
    todo = sum(sizes[f] for f in files
               if not isinstance(try_to_load_from_cache(hub_id, f), str))
    return files + extra, todo


def download(notebooks=None, models=None, dry_run: bool = False, gpu: str | None = None) -> int:
    """Fetch (or with dry_run, list) what `notebooks` need, only `models` if given; for a card
    (`gpu`, a profile key), not the files of a model in a precision that does not fit it (the
    notebooks skip those cells there: models/fit.py, the plan's rule). Offline mode and the
    cache folder are checked first, before any network call."""
    if not dry_run:
        check_online()
        check_cache_folder()
    rows = course_downloads(notebooks)
    if models is not None:
        rows = [r for r in rows if r[0] in models]
    if gpu is not None:
        rows, left = for_card(rows, gpu_profile(gpu))
        for line in left:
            print(line)
    if not rows:
        raise FastdiffError("Nothing to download for these notebooks and models.")
    print(table(rows))
    if dry_run:
        return 0
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    plans = []
    for model, files, _, _ in rows:
        hub_id, folders = repo_folders(model)
        try:
            patterns, todo = _allow_patterns(hub_id, folders, files)
        except (GatedRepoError, RepositoryNotFoundError) as exc:
            raise _access_error(hub_id, exc) from None
        plans.append((model, files, hub_id, patterns, todo))
    total = sum(p[-1] for p in plans)
    check_disk(total, "This download")
    print(f"fastdiff: {total / GB:.1f} GB to download into {cache_folder()} "
          f"({free_bytes(cache_folder()) / GB:.0f} GB free)")
    for model, files, hub_id, patterns, todo in plans:
        print(f"fastdiff: {model} ({hub_id}), its {files} files: {todo / GB:.1f} GB")
        try:
            snapshot_download(hub_id, allow_patterns=patterns)
        except (GatedRepoError, RepositoryNotFoundError) as exc:
            raise _access_error(hub_id, exc) from None
    return 0


def _access_error(hub_id: str, exc: Exception) -> FastdiffError:
    return FastdiffError(
        f"{hub_id} refused the download ({type(exc).__name__}): a gated repository needs "
        f"access. Accept its terms at https://huggingface.co/{hub_id} while logged in, then "
        "log this machine in (`hf auth login`, or set HF_TOKEN), and run the command again.")


def run(args: argparse.Namespace, argv=None) -> int:
    return download(args.notebooks, args.models, args.dry_run, args.gpu)
