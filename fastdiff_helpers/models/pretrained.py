"""Pretrained weights: are they here (a local folder, the hub cache, a reachable hub whose
gate lets this machine's token in), which weight source "auto" picks (choose_weights), and
from_pretrained with safetensors only.

Introduced in 00_setup.ipynb. The hub is asked through models/hub.py; diffusers is imported
inside the functions (cost at import; see build.py).
"""

from __future__ import annotations

import os

import torch

from ..errors import FastdiffError
from .. import checks
from .hub import (cached, gate_access, gate_todo, hub_errors, model_info, needs_access, offline,
                  weight_kinds)
from .presets import ModelSpec, get_spec
from .hooks import WEIGHTS_RULES

WEIGHTS = ("auto", "pretrained", "random", "tiny")
HUB_TIMEOUT_S = 5  # each question to the hub (model_info, the gate's access check)
NOISE = "real speed, memory and FLOPs; every image is noise"


def pretrained_status(spec: ModelSpec, path: str | None = None) -> tuple[bool, str, str | None]:
    """(available, why, gate): a local pipeline folder, the local hub cache, or a reachable hub
    that lets this machine's token download the weights (a gated repository says "gated: needs
    access" when it does not, and gate is its "auto" or "manual"; else None)."""
    if path is not None:
        if os.path.isfile(os.path.join(path, "model_index.json")):
            return True, f"local pipeline folder {path}", None
        return False, f"{path} is not a pipeline folder (no model_index.json)", None
    index = cached(spec.hub_id, "model_index.json")
    partly = ""
    if index is not None:
        # the components whose cached folder holds no safetensors weights from_pretrained would
        # load: plain or fp16 (what a half-precision load takes, models/downloads.py), a single
        # file or shards
        snapshot = os.path.dirname(index)
        missing = [name for name in spec.full
                   if not weight_kinds(os.path.join(snapshot, name)) & {"safetensors", "fp16"}]
        if not missing:
            return True, f"{spec.hub_id} is in the local Hugging Face cache", None
        partly = (f"{spec.hub_id} is only partly cached (model_index.json, but no safetensors "
                  f"weights for {', '.join(missing)})")
    where = partly or f"{spec.hub_id} is not cached"
    if off := offline():
        return False, partly or f"{where} and {off} is set", None
    try:
        info = model_info(spec.hub_id, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # any network or hub failure means: not reachable now
        return False, f"{where} and the hub is unreachable ({type(exc).__name__})", None
    # ModelInfo.gated: False, "auto" or "manual" (huggingface_hub/hf_api.py, ModelInfo); a gated
    # repository answers model_info to anyone, its files only to a token that was let in
    gated = getattr(info, "gated", None) or None
    if gated:
        access, said = gate_access(spec.hub_id, HUB_TIMEOUT_S)
        if access is None:
            return False, f"{where} and the hub did not answer its access check ({said})", None
        if not access:
            return False, (needs_access(spec.hub_id, f"{gated} approval; {said}")
                           + (f"; {partly}" if partly else "")), gated
    let_in = " (gated: the token here has access)" if gated else ""
    if partly:
        return True, (f"{partly}; the hub is reachable{let_in}, from_pretrained downloads "
                      "the rest"), None
    return True, f"{spec.hub_id} is reachable on the Hugging Face hub{let_in}", None


def require_pretrained(spec: ModelSpec, path: str | None) -> None:
    """Refuse, before any loading, pretrained weights that are not there, saying what to do."""
    ok, why, gated = pretrained_status(spec, path)
    if not ok:
        if path is not None:
            raise FastdiffError(f"Cannot load {spec.key!r} from {path!r}: {why}. Pass a folder "
                                "written by pipe.save_pretrained() or by `hf download "
                                f"{spec.hub_id} --local-dir DIR`.")
        local = "" if checks.in_command_line() else f" (or pass {checks.arg('path')} a local copy)"
        fetch = (f"To get access: {gate_todo(spec.hub_id, gated)}; then run this again" if gated
                 else f"On a machine with network run `hf download {spec.hub_id}`{local}")
        raise FastdiffError(
            f"Pretrained weights for {spec.key!r} are not available: {why}. {fetch}, or use "
            f"{checks.arg('weights', 'random')} (full-size architecture, random weights: real "
            f"speed and memory) or {checks.arg('weights', 'tiny')} (small CPU model).")


def load_pretrained(spec: ModelSpec, path: str | None, dtype: torch.dtype,
                    variant: str | None = None):
    """from_pretrained, safetensors only; `variant` "fp16": the repo's fp16 files where a
    folder has them (models/downloads.py decides it per load dtype)."""
    import diffusers

    cls = getattr(diffusers, spec.pipeline_class)
    no_checker = dict(safety_checker=None, requires_safety_checker=False)
    try:  # dtype=: torch_dtype is deprecated; variant=None is from_pretrained's default
        return cls.from_pretrained(path or spec.hub_id, dtype=dtype, use_safetensors=True,
                                   variant=variant, **(no_checker if spec.key == "sd15" else {}))
    except OSError as exc:
        gate = hub_errors().GatedRepoError
        # diffusers re-raises a refused gate as an EnvironmentError from it
        # (pipelines/pipeline_utils.py, DiffusionPipeline.download)
        if isinstance(exc, gate) or isinstance(exc.__cause__, gate):
            refused = needs_access(spec.hub_id, "the hub refused this machine's token")
            raise FastdiffError(f"{refused}: {gate_todo(spec.hub_id)}.") from None
        raise FastdiffError(f"Loading {spec.key!r} from {path or spec.hub_id} failed: {exc}. "
                            "Only safetensors weights are loaded; check the folder holds "
                            "*.safetensors files for every component.") from None


def check_weights(weights: str) -> None:
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise FastdiffError(f"Unknown weights {weights!r}. Use one of {', '.join(WEIGHTS)}.")


def resolve_weights(model: str | ModelSpec, weights: str, device: str,
                    path: str | None = None, verbose: bool = True) -> str:
    """`weights` itself, or for "auto" the source choose_weights picks, printing why (random
    weights always, whatever `verbose`); where "auto" stops, a FastdiffError says why."""
    check_weights(weights)
    if weights != "auto":
        return weights
    spec = get_spec(model)
    weights, why = choose_weights(spec, path, device)
    if weights == "none":
        raise FastdiffError(f"No weights for {spec.key!r} on this GPU: {why}.")
    if weights == "random":
        print(f"fastdiff: weights='random' for {spec.key}: RANDOM WEIGHTS ({why})")
    elif verbose:
        print(f"fastdiff: weights='{weights}' for {spec.key} ({why})")
    return weights


def choose_weights(spec: ModelSpec, path: str | None, device: str, rules: bool = True,
                   before: str = "") -> tuple[str, str]:
    """What weights="auto" picks for `spec` on `device`, and why:
    - on a CPU: pretrained when available, else the tiny model (as CI's smoke mode and
      `make demo`);
    - on a GPU: pretrained when available, else "none": "auto" stops (resolve_weights raises a
      FastdiffError) rather than pick random weights on its own, why saying what to do
      (reconnect, `hf download`, get access to a gated repository, or weights="random" by name).
    A rule put in models/hooks.py (the course's carried choice) is asked first, unless not
    `rules`; `before`: what it says ahead of why "auto" stops. Introduced in 00_setup.ipynb."""
    for rule in WEIGHTS_RULES if rules else ():
        chosen = rule(spec, path, device)
        if chosen is not None:
            return chosen
    ok, why, gated = pretrained_status(spec, path)
    if ok:
        return "pretrained", why
    if not device.startswith("cuda"):
        return "tiny", f"{why}; no GPU, so the tiny model"
    fetch = (gate_todo(spec.hub_id, gated) if gated else
             (f"unset {off} and reconnect" if (off := offline()) else "reconnect")
             + f", or run `hf download {spec.hub_id}` (here, or on a machine with network "
             "and copy its Hugging Face cache)")
    return "none", (f"{why}; {before}on a GPU \"auto\" stops rather than pick random weights: "
                    f"{fetch}, then run the cell again; or ask for random weights by name, "
                    f"{checks.arg('weights', 'random')} ({NOISE})")
