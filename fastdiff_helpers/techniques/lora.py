"""LoRAs on a compiled pipeline: loading one, and hot-swapping another one in place without
recompiling; and the LoRA files themselves, found and read (the course's stand-ins, made in
code, are course/lora_swaps.py's fdh.course.make_lora_file). Fusing, unfusing and unloading are
diffusers' own calls (pipe.fuse_lora(), pipe.unfuse_lora(), pipe.unload_lora_weights()): what
they leave is read off the pipeline's peft layers here, so nothing needs to be told.

diffusers' hot-swap (0.33+, PR 9453; diffusers/loaders/peft.py, load_lora_adapter): after
`pipe.enable_lora_hotswap(target_rank=R)` the first LoRA loaded is padded to rank R and its
scale becomes a tensor (peft/utils/hotswap.py, prepare_model_for_compiled_hotswap), so a later
`load_lora_weights(..., hotswap=True)` copies new weights into the same tensors: the compiled
graph and its guards see nothing change. What breaks it, checked here before any work:
a LoRA that targets layers the first one did not (peft raises "unexpected keys",
peft/utils/hotswap.py:491), a rank above R (peft swaps the tensors for larger ones:
hotswap.py:572, the shapes change), text-encoder LoRAs (diffusers refuses,
loaders/lora_base.py:369), and a LoRA config that differs from the loaded one's in what peft
compares (per-layer alphas, e.g. from mixed ranks; dropout, rsLoRA, DoRA: hotswap.py:34 and
622, called at diffusers/loaders/peft.py:321). Each of these fails inside diffusers'
try block, whose except branch then deletes the loaded adapter (loaders/peft.py:356-366).
Introduced in 14_lora_hotswap.ipynb.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..checks import arg, whole
from ..errors import FastdiffError
from ..models.build import quiet_diffusers
from ..models.loading import get_denoiser, pipeline_spec
from ..models.hub import fetch
from ._state import applied, record

__all__ = ["lora_file_info", "enable_lora_hotswap", "load_lora", "loaded_lora", "resolve_lora",
           "check_loadable", "LORA_FILE"]

# --- LoRA files: found, read from their header -------------------------------------

LORA_FILE = "pytorch_lora_weights.safetensors"   # the name diffusers saves and loads


def check_loadable(pipe) -> None:
    """Refuse a pipeline diffusers has no LoRA loader for."""
    if not hasattr(pipe, "load_lora_weights"):
        raise FastdiffError(f"{type(pipe).__name__} has no LoRA loader in diffusers (no "
                            "load_lora_weights); use an SD1.5, SDXL or SSD-1B pipeline.")


def resolve_lora(source, weight_name: str | None = None) -> Path:
    """The LoRA file a source names: a folder (its pytorch_lora_weights.safetensors, or
    `weight_name`), a .safetensors file, or a hub id (the file `weight_name`, downloaded to the
    Hugging Face cache, or found there offline). A (hub id or folder, weight_name) pair works
    too. Introduced in 14_lora_hotswap.ipynb."""
    if isinstance(source, tuple) and len(source) == 2:
        source, weight_name = source
    if not isinstance(source, (str, Path)) or not str(source):
        raise FastdiffError(f"{arg('lora', source)} cannot work: give a folder, a .safetensors "
                            "file or a hub id (with weight_name=).")
    path = Path(source)
    if path.is_dir():
        path = path / (weight_name or LORA_FILE)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise FastdiffError(f"{path} is not a .safetensors file: the course loads "
                                "safetensors only (a pickle file can run code when loaded).")
        return path
    if path.exists() or path.parent.is_dir() and str(source).startswith((".", "/")):
        raise FastdiffError(f"{arg('lora', str(source))}: no LoRA file there ({path} does not "
                            "exist); give a folder written by save_lora_weights or "
                            "fdh.course.make_lora_file.")
    try:
        if weight_name is not None:
            return Path(fetch(str(source), weight_name))
        # no name given: the repo's one .safetensors file (diffusers guesses the same way)
        files = sorted(Path(fetch(str(source), patterns=["*.safetensors"])).rglob("*.safetensors"))
    except Exception as exc:  # offline, unknown repo, no such file: all say the same next step
        raise FastdiffError(f"{arg('lora', str(source))}: no local LoRA file and the hub gave "
                            f"none ({type(exc).__name__}). On a machine with network run `hf "
                            f"download {source} {weight_name or ''}`, or give a local "
                            "folder.") from None
    if len(files) != 1:
        raise FastdiffError(f"{source} holds {len(files)} .safetensors files "
                            f"({', '.join(f.name for f in files[:4])}): say which one with "
                            "weight_name=.")
    return files[0]


def lora_file_info(source, weight_name: str | None = None) -> dict[str, Any]:
    """What a LoRA file holds, read from its safetensors header without loading a tensor:
    its rank, the layers it targets (diffusers' names, without the 'unet.' prefix), and
    whether it has text-encoder layers. `source` as for resolve_lora.
    Introduced in 14_lora_hotswap.ipynb."""
    from safetensors import safe_open

    path = resolve_lora(source, weight_name)
    ranks, layers, text = set(), set(), False
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            if key.startswith(("text_encoder", "lora_te")):
                text = True
                continue
            if ".lora_A." in key or ".lora.down." in key or ".lora_down." in key:
                ranks.add(f.get_slice(key).get_shape()[0])
                layers.add(re.split(r"\.lora[._]", key)[0].removeprefix("unet.").removeprefix(
                    "transformer."))
    return {"path": str(path), "rank": max(ranks) if ranks else 0, "layers": sorted(layers),
            "text_encoder": text}


# --- LoRAs on a pipeline: load, hot-swap ---------------------------------------------------------

def _lora_layers(pipe) -> list:
    """The denoiser's peft LoRA layers (peft's BaseTunerLayer): none before a LoRA is loaded
    and after diffusers' pipe.unload_lora_weights(), which puts the base layers back
    (diffusers/loaders/peft.py:718 unload_lora, utils/peft_utils.py:35
    recurse_remove_peft_layers). A fused one is `merged` (peft/tuners/tuners_utils.py:1970:
    merged_adapters not empty, which diffusers' pipe.fuse_lora() fills)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in get_denoiser(pipe).modules() if isinstance(m, BaseTunerLayer)]


def loaded_lora(pipe) -> dict[str, Any] | None:
    """What load_lora recorded of the loaded LoRA, while its layers are still there: a record
    that diffusers' own unload left behind is dropped here."""
    if "lora" in applied(pipe) and not _lora_layers(pipe):
        applied(pipe).pop("lora")
    return applied(pipe).get("lora")


def enable_lora_hotswap(pipe, target_rank: int) -> None:
    """diffusers' `pipe.enable_lora_hotswap(target_rank=...)`, before the first LoRA and before
    compiling: every LoRA loaded later must have a rank <= target_rank. Introduced in
    14_lora_hotswap.ipynb."""
    check_loadable(pipe)
    whole("target_rank", target_rank, 1)
    if loaded_lora(pipe):
        raise FastdiffError("Enable hot-swap before the first LoRA is loaded: load a fresh "
                            "pipeline, call fdh.enable_lora_hotswap, then fdh.load_lora.")
    if "compile" in applied(pipe):
        raise FastdiffError("Enable hot-swap before compiling (the padded LoRA layers must be "
                            "in the compiled graph): load a fresh pipeline, then "
                            "enable_lora_hotswap, load_lora, compile.")
    pipe.enable_lora_hotswap(target_rank=target_rank)
    record(pipe, "lora_hotswap", {"target_rank": target_rank})


def _new_lora_config(pipe, path: Path):
    """The LoraConfig diffusers builds for this file's denoiser part when it loads it, made by
    the same diffusers functions on the file alone (diffusers builds it only inside
    load_lora_adapter, diffusers/loaders/peft.py:238-276, after which a failure deletes the
    loaded adapter): lora_state_dict, the denoiser prefix, the peft conversion, the ranks."""
    from diffusers.utils import convert_unet_state_dict_to_peft
    from diffusers.utils.peft_utils import _create_lora_config

    prefix = f"{pipeline_spec(pipe).denoiser}."
    state, alphas, metadata = pipe.lora_state_dict(str(path.parent), weight_name=path.name,
                                                   unet_config=get_denoiser(pipe).config,
                                                   return_lora_metadata=True)

    def denoiser_part(keyed: dict | None) -> dict | None:  # None and {} stay as they are
        return keyed and {k.removeprefix(prefix): v for k, v in keyed.items()
                          if k.startswith(prefix)}

    state, alphas, metadata = denoiser_part(state), denoiser_part(alphas), denoiser_part(metadata)
    if state and "lora_A" not in next(iter(state)):
        state = convert_unet_state_dict_to_peft(state)
    ranks = {f"^{k}": v.shape[1] for k, v in state.items() if "lora_B" in k and v.ndim > 1}
    return _create_lora_config(state, alphas, metadata, ranks)


def _check_configs(pipe, info: dict[str, Any], adapter_name: str) -> None:
    """peft's own hot-swap check (check_hotswap_configs_compatible, peft/utils/hotswap.py:587),
    run before loading instead of inside diffusers' try block."""
    from peft.utils.hotswap import CONFIG_KEYS_TO_CHECK, check_hotswap_configs_compatible

    loaded = getattr(get_denoiser(pipe), "peft_config", {}).get(adapter_name)
    if loaded is None:
        return  # no such adapter: diffusers says so itself before touching anything (peft.py:219)
    new = _new_lora_config(pipe, Path(info["path"]))
    try:
        check_hotswap_configs_compatible(loaded, new)
    except ValueError as err:
        def said(value) -> str:  # alpha_pattern can name hundreds of layers
            if isinstance(value, dict) and value:
                return f"{len(value)} per-layer value(s), e.g. {next(iter(value.items()))}"
            return repr(value)

        keys = CONFIG_KEYS_TO_CHECK.get(loaded.peft_type, [])
        a, b = loaded.to_dict(), new.to_dict()
        diff = "; ".join(f"{key}: {said(a.get(key))} loaded, {said(b.get(key))} in this file"
                         for key in keys if a.get(key) != b.get(key)) or str(err)[:200]
        raise FastdiffError(f"{info['path']}: its LoRA config differs from the loaded one's in "
                            f"what peft's hot-swap check compares ({diff}), which a hot-swap "
                            "cannot change (the compiled scales keep the first LoRA's alphas; "
                            "mixed ranks give per-layer alphas). Load it with hotswap=False "
                            "(the compiled pipeline recompiles), or use LoRAs with the same "
                            "per-layer ranks and alphas.") from None


def _check_swap(pipe, info: dict[str, Any], adapter_name: str = "default") -> None:
    """The four ways a hot-swap breaks, said before diffusers or peft would fail mid-load."""
    hot = applied(pipe).get("lora_hotswap")
    current = loaded_lora(pipe)
    if current is None:
        raise FastdiffError("hotswap=True needs a LoRA to swap out: load the first one with "
                            "fdh.load_lora(pipe, folder) (hotswap=False).")
    if info["text_encoder"]:
        raise FastdiffError(f"{info['path']} has text-encoder layers, which diffusers cannot "
                            "hot-swap (loaders/lora_base.py); load it with hotswap=False (the "
                            "compiled pipeline recompiles) or use a LoRA of the denoiser only.")
    new = set(info["layers"]) - set(current["layers"])
    if new:
        raise FastdiffError(f"{info['path']} targets {len(new)} layer(s) the first LoRA did not "
                            f"(e.g. {sorted(new)[0]}); a hot-swap can only fill the layers "
                            "already there (peft/utils/hotswap.py). Load a LoRA that targets "
                            "those layers first, or load this one with hotswap=False.")
    _check_configs(pipe, info, adapter_name)
    limit = hot["target_rank"] if hot else current["rank"]
    if info["rank"] > limit:
        raise FastdiffError(f"{info['path']} has rank {info['rank']}, above the "
                            f"{'target rank' if hot else 'loaded rank'} {limit}: its tensors "
                            "cannot fit the compiled ones. Load a fresh pipeline with "
                            f"fdh.enable_lora_hotswap(pipe, target_rank={info['rank']}) or more.")


def load_lora(pipe, lora, hotswap: bool = False, adapter_name: str = "default",
              weight_name: str | None = None):
    """diffusers' `pipe.load_lora_weights(lora, adapter_name=..., hotswap=...)` (`lora` as for
    resolve_lora: a folder, a file or a hub id with `weight_name`), checked first: with
    hotswap=True the new LoRA replaces the loaded one in place (same layers or a subset, rank
    <= the target rank, no text encoder, a config peft finds compatible), else it is refused
    with what to do, before anything is loaded.
    Introduced in 14_lora_hotswap.ipynb."""
    check_loadable(pipe)
    if not isinstance(hotswap, bool):
        raise FastdiffError(f"{arg('hotswap', hotswap)} cannot work: give True or False.")
    info = lora_file_info(lora, weight_name)
    if any(layer.merged for layer in _lora_layers(pipe)):  # diffusers' pipe.fuse_lora()
        raise FastdiffError("The loaded LoRA is fused into the weights: pipe.unfuse_lora() "
                            "first (peft refuses to swap a merged adapter).")
    if hotswap:
        _check_swap(pipe, info, adapter_name)
    elif loaded_lora(pipe) and adapter_name in pipe.get_list_adapters().get(
            pipeline_spec(pipe).denoiser, []):
        raise FastdiffError(f"An adapter named {adapter_name!r} is loaded already: pass "
                            "hotswap=True to replace it in place, another adapter_name, or "
                            "call pipe.unload_lora_weights() first.")
    path = Path(info["path"])
    with quiet_diffusers():  # "No LoRA keys associated to CLIPTextModel": none were meant
        pipe.load_lora_weights(str(path.parent), weight_name=path.name,
                               adapter_name=adapter_name, hotswap=hotswap)
    # a hot-swap fills the layers already there: they stay the first LoRA's
    layers = applied(pipe)["lora"]["layers"] if hotswap else info["layers"]
    record(pipe, "lora", {"path": info["path"], "rank": info["rank"], "layers": layers,
                          "adapter_name": adapter_name, "hotswapped": hotswap})
    return pipe
