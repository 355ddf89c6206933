"""Pretrained weights: is a model available (local folder, hub cache, reachable hub), which
weight source "auto" picks, and from_pretrained with safetensors only.

Introduced in 00_setup.ipynb. huggingface_hub and diffusers are imported inside the functions
(cost at import; see build.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import FastdiffError
from .. import checks
from .presets import ModelSpec, get_spec

WEIGHTS = ("auto", "pretrained", "random", "tiny")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def pretrained_status(spec: ModelSpec, path: str | None = None) -> tuple[bool, str]:
    """(available, why): a local pipeline folder, the local hub cache, or a reachable hub."""
    if path is not None:
        if os.path.isfile(os.path.join(path, "model_index.json")):
            return True, f"local pipeline folder {path}"
        return False, f"{path} is not a pipeline folder (no model_index.json)"
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(spec.hub_id, "model_index.json")
    partly = ""
    if isinstance(cached, str):
        missing = _uncached_weights(spec, os.path.dirname(cached))
        if not missing:
            return True, f"{spec.hub_id} is in the local Hugging Face cache"
        partly = (f"{spec.hub_id} is only partly cached (model_index.json, but no safetensors "
                  f"weights for {', '.join(missing)})")
    if _hub_offline():
        return False, partly or f"{spec.hub_id} is not cached and HF_HUB_OFFLINE is set"
    from huggingface_hub import model_info

    try:
        model_info(spec.hub_id, timeout=5)
    except Exception as exc:  # any network or hub failure means: not reachable now
        return False, (partly or f"{spec.hub_id} is not cached") + \
            f" and the hub is unreachable ({type(exc).__name__})"
    if partly:
        return True, f"{partly}; the hub is reachable, from_pretrained downloads the rest"
    return True, f"{spec.hub_id} is reachable on the Hugging Face hub"


def _uncached_weights(spec: ModelSpec, snapshot: str) -> list[str]:
    """The model components (unet, vae, text encoders...) whose folder in a cached snapshot
    holds no safetensors weights that from_pretrained would load: plain or fp16 (what a
    half-precision load takes, models/downloads.py), a single file or shards (a snapshot
    holds only what was downloaded; a file there is a link to a blob, which must exist)."""
    missing = []
    for name in spec.full:
        folder = os.path.join(snapshot, name)
        files = os.listdir(folder) if os.path.isdir(folder) else []
        if not any(f.endswith(".safetensors") and f.split(".")[1].split("-")[0] in ("safetensors", "fp16")
                   and os.path.exists(os.path.join(folder, f)) for f in files):
            missing.append(name)
    return missing


def require_pretrained(spec: ModelSpec, path: str | None) -> None:
    """Refuse, before any loading, pretrained weights that are not there, saying what to do."""
    ok, why = pretrained_status(spec, path)
    if not ok:
        if path is not None:
            raise FastdiffError(f"Cannot load {spec.key!r} from {path!r}: {why}. Pass a folder "
                                "written by pipe.save_pretrained() or by `hf download "
                                f"{spec.hub_id} --local-dir DIR`.")
        local = "" if checks.in_command_line() else f" (or pass {checks.arg('path')} a local copy)"
        raise FastdiffError(
            f"Pretrained weights for {spec.key!r} are not available: {why}. On a machine with "
            f"network run `hf download {spec.hub_id}`{local}, or use "
            f"{checks.arg('weights', 'random')} (full-size architecture, random weights: real "
            f"speed and memory) or {checks.arg('weights', 'tiny')} (small CPU model).")


def load_pretrained(spec: ModelSpec, path: str | None, dtype: torch.dtype, check: bool = True,
                    variant: str | None = None):
    """from_pretrained, safetensors only; `variant` "fp16": the repo's fp16 files where a
    folder has them (models/downloads.py decides it per load dtype)."""
    import diffusers

    if check:  # load_pipeline checked already
        require_pretrained(spec, path)
    cls = getattr(diffusers, spec.pipeline_class)
    kwargs: dict[str, Any] = dict(dtype=dtype, use_safetensors=True)  # torch_dtype: deprecated
    if variant is not None:
        kwargs["variant"] = variant
    if spec.key == "sd15":
        kwargs.update(safety_checker=None, requires_safety_checker=False)
    try:
        return cls.from_pretrained(path or spec.hub_id, **kwargs)
    except OSError as exc:
        raise FastdiffError(f"Loading {spec.key!r} from {path or spec.hub_id} failed: {exc}. "
                            "Only safetensors weights are loaded; check the folder holds "
                            "*.safetensors files for every component.") from None


def check_weights(weights: str) -> str:
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise FastdiffError(f"Unknown weights {weights!r}. Use one of {', '.join(WEIGHTS)}.")
    return weights


def resolve_weights(model: str | ModelSpec, weights: str, device: str,
                    path: str | None = None, verbose: bool = True) -> str:
    """`weights` itself, or for "auto" the source choose_weights picks, printing why."""
    check_weights(weights)
    if weights != "auto":
        return weights
    spec = get_spec(model)
    weights, why = choose_weights(spec, path, device)
    if verbose:
        print(f"fastdiff: weights='{weights}' for {spec.key} ({why})")
    return weights


def choose_weights(spec: ModelSpec, path: str | None, device: str) -> tuple[str, str]:
    """What weights="auto" picks for `spec` on `device`, and why: pretrained when the weights
    are at `path`, in the local Hugging Face cache or reachable, else random on a GPU, else
    tiny. Introduced in 00_setup.ipynb."""
    ok, why = pretrained_status(spec, path)
    if ok:
        return "pretrained", why
    if device.startswith("cuda"):
        return "random", f"{why}; on a GPU the full-size architecture with random weights"
    return "tiny", f"{why}; no GPU, so the tiny model"
