"""LoRA files: one made in code for any denoiser (peft's layers on a meta-device copy, saved by
diffusers' own save_lora_weights), found (a folder, a file, a hub id) and read from its
safetensors header. Introduced in 14_lora_hotswap.ipynb."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checks import arg, output_folder, same_bytes, whole
from ..errors import FastdiffError
from ..models.hub import fetch
from ..models.loading import get_denoiser

__all__ = ["make_lora_file", "lora_file_info", "resolve_lora", "DEFAULT_LORA_TARGETS",
           "LORA_FILE", "TEXT_ENCODER_TARGETS"]

# the attention projections every LoRA trainer of diffusers targets (train_text_to_image_lora)
DEFAULT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
TEXT_ENCODER_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")
LORA_FILE = "pytorch_lora_weights.safetensors"   # the name diffusers saves and loads


def _check_loadable(pipe) -> None:
    if not hasattr(pipe, "load_lora_weights"):
        raise FastdiffError(f"{type(pipe).__name__} has no LoRA loader in diffusers (no "
                            "load_lora_weights); use an SD1.5, SDXL or SSD-1B pipeline.")


def _lora_tensors(module: torch.nn.Module, rank: int, targets: Sequence[str],
                  generator: torch.Generator, rank_pattern: dict[str, int] | None = None
                  ) -> dict[str, torch.Tensor]:
    """peft's LoRA layers injected into a meta-device copy of `module`'s architecture (no weight
    memory, any size), then filled with seeded random A and B: the names and shapes are peft's,
    the values small enough that the image stays an image."""
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    with init_empty_weights(include_buffers=False):
        if hasattr(module, "from_config"):                  # a diffusers model
            skeleton = type(module).from_config(module.config)
        else:                                               # a transformers text encoder
            skeleton = type(module)(module.config)
    # alpha = rank per layer (scale 1), as diffusers assumes for a file without alphas
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets),
                        rank_pattern=dict(rank_pattern or {}),
                        alpha_pattern=dict(rank_pattern or {}), init_lora_weights=False)
    with init_empty_weights(include_buffers=False):
        inject_adapter_in_model(config, skeleton)
    values = {}
    for name, param in skeleton.named_parameters():
        if "lora_" not in name:
            continue
        fan_in = param.shape[1]
        values[name] = torch.randn(tuple(param.shape), generator=generator) / fan_in ** 0.5
    if not values:
        raise FastdiffError(f"No layer of {type(module).__name__} matches {arg('targets', targets)}"
                            f"; give names of its Linear layers, e.g. {DEFAULT_LORA_TARGETS}.")
    return get_peft_model_state_dict(skeleton, state_dict=values)


def make_lora_file(pipe, folder: str | Path, rank: int = 4,
                   targets: Sequence[str] = DEFAULT_LORA_TARGETS, seed: int = 0,
                   text_encoder: bool = False, dtype: torch.dtype = torch.float32,
                   rank_pattern: dict[str, int] | None = None) -> Path:
    """Write a LoRA for this pipeline's denoiser as a user's file would be: peft's layer names,
    converted to diffusers' format and saved by the pipeline's own `save_lora_weights`
    (safetensors, `folder/pytorch_lora_weights.safetensors`). Random weights (seeded), rank
    `rank`, alpha = rank (scale 1, which is also what diffusers assumes for a file that does not
    say: diffusers/utils/peft_utils.py, get_peft_kwargs). `text_encoder=True` adds a LoRA on
    the (first) text encoder. `rank_pattern` gives some layers another rank (peft's
    LoraConfig.rank_pattern, e.g. {"to_q": 2}): a LoRA of mixed ranks, as trainers write them.
    Built on the meta device, so it costs no model memory; for the
    tiny models in tests and smoke runs (on real weights, load a real LoRA by hub id).
    A folder that holds another LoRA file, or files of someone else's, is refused.
    Returns the folder. Introduced in 14_lora_hotswap.ipynb."""
    from diffusers.utils import convert_state_dict_to_diffusers

    _check_loadable(pipe)
    whole("rank", rank, 1)
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) for t in targets):
        raise FastdiffError(f"{arg('targets', targets)} cannot work: give a list of layer names, "
                            f"e.g. {list(DEFAULT_LORA_TARGETS)}.")
    folder = output_folder("folder", folder, (LORA_FILE,), "make_lora_file")
    generator = torch.Generator("cpu").manual_seed(whole("seed", seed, 0))
    if rank_pattern is not None and not (isinstance(rank_pattern, dict) and all(
            isinstance(k, str) and isinstance(v, int) and v >= 1 for k, v in rank_pattern.items())):
        raise FastdiffError(f"{arg('rank_pattern', rank_pattern)} cannot work: give a dict of "
                            "layer name to rank, e.g. {'to_q': 2}.")
    layers = {"unet_lora_layers": _lora_tensors(get_denoiser(pipe), rank, targets, generator,
                                                rank_pattern)}
    if text_encoder:
        layers["text_encoder_lora_layers"] = _lora_tensors(pipe.text_encoder, rank,
                                                           TEXT_ENCODER_TARGETS, generator)
    layers = {k: {n: t.to(dtype) for n, t in convert_state_dict_to_diffusers(v).items()}
              for k, v in layers.items()}
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".lora.tmp") as tmp:
        type(pipe).save_lora_weights(tmp, safe_serialization=True, **layers)
        if same_bytes(folder / LORA_FILE, (Path(tmp) / LORA_FILE).read_bytes()) is False:
            raise FastdiffError(f"{folder / LORA_FILE} holds another LoRA, left as it is: give "
                                f"a new {arg('folder')}.")
        os.replace(Path(tmp) / LORA_FILE, folder / LORA_FILE)  # the same bytes, or a new file
    return folder


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
                            "fdh.make_lora_file.")
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
