"""The Hugging Face hub, asked in one place. Introduced in 00_setup.ipynb. huggingface_hub is
imported inside the functions (cost at import; see build.py): the function asked is the one it
has at the call.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

from .. import checks
from ..errors import FastdiffError

# what from_pretrained(use_safetensors=True) leaves out (pipeline_loading_utils.py
# _get_ignore_patterns)
IGNORED = ["*.bin", "*.msgpack", "*.onnx", "*.pb"]
_INFO: dict[tuple, Any] = {}  # (the model_info asked, hub id) -> its answer with file sizes


def offline() -> str | None:
    """Which variable puts the hub offline (HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE), or None."""
    # huggingface_hub/constants.py: `HF_HUB_OFFLINE = _is_true(os.environ.get("HF_HUB_OFFLINE")
    # or os.environ.get("TRANSFORMERS_OFFLINE"))`, _is_true: `value.upper() in
    # ENV_VARS_TRUE_VALUES`: the same variables and values, read at each call (there at import)
    from huggingface_hub import constants

    name = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    on = tuple(sorted(v.lower() for v in constants.ENV_VARS_TRUE_VALUES))
    return name if checks.env_switch(name, "the hub's offline mode", on=on) else None


def model_info(hub_id: str, timeout: float, files: bool = False):
    """model_info of `hub_id`; with `files` (file sizes) asked once per process (a file list
    stays put), without each time (is the hub answering now, and its gate?)."""
    import huggingface_hub

    ask = huggingface_hub.model_info
    if not files:
        return ask(hub_id, timeout=timeout)
    # a dict keyed by the function asked too, not lru_cache: a replaced model_info (a test's
    # hub) gets no answer of another; a failure is not kept
    key = (ask, hub_id)
    if key not in _INFO:
        _INFO[key] = ask(hub_id, files_metadata=True, timeout=timeout)
    return _INFO[key]


def file_sizes(hub_id: str) -> dict[str, int]:  # each file of the repository: its bytes
    return {s.rfilename: s.size or 0 for s in model_info(hub_id, 10, files=True).siblings}


def cached(hub_id: str, filename: str) -> str | None:
    """The path of a repository's file in the local cache, or None (no network: it looks)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(hub_id, filename)
    return found if isinstance(found, str) else None


def fetch(hub_id: str, filename: str | None = None, patterns: list[str] | None = None) -> str:
    """The path of one file of the repository, or with `patterns` the folder of its snapshot
    of the files they match, fetched into the cache (huggingface_hub's progress bars)."""
    import huggingface_hub as hub

    host_token()  # a gated repository's files need it
    if filename is not None:
        return hub.hf_hub_download(hub_id, filename)
    return hub.snapshot_download(hub_id, allow_patterns=patterns)


def free_bytes(folder: str) -> int:
    """Free bytes on the disk of `folder` (its nearest existing parent)."""
    return shutil.disk_usage(checks.nearest_existing(folder)).free


def check_cache_folder() -> str:
    """Refuse, before any network call, a Hugging Face cache that cannot be a folder: HF_HOME or
    HF_HUB_CACHE naming a regular file (huggingface_hub would fail deep inside with
    NotADirectoryError, or reach the network first), or a folder this user cannot write; else
    the cache folder."""
    from huggingface_hub import constants

    home, hub_cache = constants.HF_HOME, constants.HF_HUB_CACHE
    named = next((v for v in ("HF_HUB_CACHE", "HF_HOME") if os.environ.get(v)), None)
    fix = (f"Point {named} at a folder (or unset it) before starting Python." if named else
           "Point HF_HUB_CACHE (or HF_HOME) at a folder before starting Python.")
    for path in map(checks.nearest_existing, (home, hub_cache)):
        why = (f"made: {path} is a file, not a folder" if not os.path.isdir(path) else
               f"written: {path} is not writable by this user"
               if not os.access(path, os.W_OK) else None)
        if why:
            raise FastdiffError(f"The Hugging Face cache {hub_cache} cannot be {why}. {fix} "
                                "Nothing was downloaded.")
    return hub_cache


def hub_errors():
    """huggingface_hub.errors (GatedRepoError, RepositoryNotFoundError), imported when asked."""
    import huggingface_hub.errors

    return huggingface_hub.errors


def host_token(environ=os.environ) -> str | None:
    """A hosted notebook's secret HF_TOKEN, where huggingface_hub does not read it itself:
    huggingface_hub reads HF_TOKEN from the environment at each call and Colab's secret of that
    name on its own (utils/_auth.py get_token: _get_token_from_environment, then
    _get_token_from_google_colab), but not Kaggle's, which this puts into HF_TOKEN. Says where
    the token came from, or None. A token is never asked for in a cell."""
    if environ.get("HF_TOKEN") or "KAGGLE_KERNEL_RUN_TYPE" not in environ:
        return None
    try:
        from kaggle_secrets import UserSecretsClient  # Kaggle's own module, on its image only
        token = UserSecretsClient().get_secret("HF_TOKEN")
    except Exception:  # no such secret, or not attached to this notebook: as with none at all
        return None
    if not token:
        return None
    environ["HF_TOKEN"] = token
    return "Kaggle's secret HF_TOKEN"


def gate_access(hub_id: str, timeout: float) -> tuple[bool | None, str]:
    """Whether this machine's token may download the gated `hub_id` (True, False, None: no
    answer), in words. auth_check (hf_api.py) returns None with access, raises GatedRepoError
    without (utils/_http.py hf_raise_for_status: X-Error-Code "GatedRepo") or, the hub's 401
    without a valid token, RepositoryNotFoundError (GatedRepoError is one: errors.py). It has
    no timeout (utils/_http.py default_client_factory: timeout=None): asked in a thread."""
    from huggingface_hub import auth_check, get_token

    host_token()
    answer: list[BaseException | None] = []

    def ask() -> None:
        try:
            answer.append(auth_check(hub_id))  # None: let in
        except Exception as exc:  # kept, judged below
            answer.append(exc)

    thread = threading.Thread(target=ask, name="fastdiff-auth-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        return None, f"no answer in {timeout} s"
    if answer[0] is None:
        return True, "the token here has access"
    if not isinstance(answer[0], hub_errors().RepositoryNotFoundError):
        return None, type(answer[0]).__name__
    token = ("no Hugging Face token on this machine" if get_token() is None else
             "the token on this machine has no access"
             if isinstance(answer[0], hub_errors().GatedRepoError)
             else "the token on this machine was refused")
    return False, token


def needs_access(hub_id: str, why: str) -> str:
    """The one wording of a gated repository this machine's token cannot read."""
    return f"{hub_id} is gated: needs access ({why})"


def gate_todo(hub_id: str, gated: str | None = None, environ=os.environ) -> str:
    """How to get into a gated repository ("manual": its authors approve), and where this host
    keeps the token: a secret on Colab and Kaggle (the same test as course/hosted.py host())."""
    wait = (" and wait for its authors to approve the request" if gated == "manual" else "")
    if any(name.startswith("COLAB_") for name in environ):
        keep = ("add a Colab secret named HF_TOKEN holding a token of that account (the key icon "
                "in the left bar; let this notebook read it)")
    elif "KAGGLE_KERNEL_RUN_TYPE" in environ:
        keep = ("add a Kaggle secret named HF_TOKEN holding a token of that account (Add-ons > "
                "Secrets, attached to this notebook)")
    else:
        keep = "`hf auth login` or set HF_TOKEN to a token of that account"
    return (f"accept its licence on https://huggingface.co/{hub_id} (logged in){wait}, then "
            f"{keep}")


def weight_kinds(folder: str) -> set[str]:
    """The kinds of safetensors weights in `folder`, single files or shards: "safetensors"
    (plain) or a variant ("fp16"); a cached snapshot's link counts where its blob exists."""
    files = os.listdir(folder) if os.path.isdir(folder) else []
    return {f.split(".")[1].split("-")[0] for f in files if f.endswith(".safetensors")
            and os.path.exists(os.path.join(folder, f))}


def weight_files(names, folders, variant: str | None) -> tuple[list[str], str | None]:
    """The safetensors files (and shard indexes) from_pretrained loads from a repository whose
    files are `names`, for the weight `folders` ("" for a repo's root), and the variant to pass
    it (None where the repo has no file of `variant`): diffusers' choice (pipeline_loading_utils
    .py variant_compatible_siblings: a folder's variant files, else its plain ones; none at
    all raises ValueError, pipeline_utils.py from_pretrained "no such modeling files")."""
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
