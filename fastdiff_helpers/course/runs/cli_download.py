"""`python -m fastdiff_helpers download [--notebooks 00 05 ...] [--models sdxl ...]
[--dry-run]`: the weights the course (or the notebooks named) loads, fetched ahead of a
workshop in the dtypes its cells run them in, sizes said first and the disk checked.

Introduced in 00_setup.ipynb. Each repository comes down by huggingface_hub's own
snapshot_download (its progress bars), restricted to the files from_pretrained loads in that
dtype (models/hub.py allow_patterns), the configs, tokenizers and scheduler beside them.
"""

from __future__ import annotations

import argparse

from ...models.gpus import PROFILES, gpu_profile
from ...errors import FastdiffError
from ...models.downloads import GB, check_disk, repo_folders, wanted_variant
from ...models.hub import (allow_patterns, check_cache_folder, check_online, fetch, gate_todo,
                          hub_errors, needs_access)
from ...models.presets import MODELS, VAES
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
    plans = []
    try:  # the repository being asked when the hub refuses is hub_id's
        for model, files, _, _ in rows:
            hub_id, parts = repo_folders(model)
            plans.append((model, files, hub_id,
                          *allow_patterns(hub_id, parts, wanted_variant(hub_id, files))))
        total = sum(p[-1] for p in plans)
        print(f"fastdiff: {total / GB:.1f} GB to download {check_disk(total, 'This download')}")
        for model, files, hub_id, patterns, todo in plans:
            print(f"fastdiff: {model} ({hub_id}), its {files} files: {todo / GB:.1f} GB")
            fetch(hub_id, patterns=patterns)
    except hub_errors().RepositoryNotFoundError as exc:  # GatedRepoError is one (errors.py)
        why = needs_access(hub_id, f"the hub refused the download: {type(exc).__name__}")
        raise FastdiffError(f"{why}. To get access: {gate_todo(hub_id)}; then run the command "
                            "again.") from None
    return 0


def run(args: argparse.Namespace, argv=None) -> int:
    return download(args.notebooks, args.models, args.dry_run, args.gpu)
