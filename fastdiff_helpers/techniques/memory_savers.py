"""The memory savers diffusers ships, one name each, and the prompt embeddings cached so the
text encoders can go.

    model-offload       pipe.enable_model_cpu_offload(): one whole component on the GPU at a time
    sequential-offload  pipe.enable_sequential_cpu_offload(): one layer at a time
    group-offload       pipe.enable_group_offload(block_level, 1 block a group, CUDA streams):
                        the next block copied while the current one runs
    vae-slicing         pipe.vae.enable_slicing(): a batch decoded one image at a time
    vae-tiling          pipe.vae.enable_tiling(): an image decoded in overlapping tiles
    text-encoders-freed the prompts encoded once, the embeddings kept, the encoders deleted

Introduced in 11_fitting_your_gpu.ipynb."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import FastdiffError
from ..models.loading import pipeline_device, pipeline_spec
from ._state import applied, record

__all__ = ["MEMORY_SAVERS", "OFFLOADS", "apply_memory_saver", "encode_prompt_once"]

OFFLOADS = ("model-offload", "sequential-offload", "group-offload")
MEMORY_SAVERS = OFFLOADS + ("vae-slicing", "vae-tiling", "text-encoders-freed")
TEXT_ENCODERS = ("text_encoder", "text_encoder_2")


def encode_prompt_once(pipe, prompt: str) -> dict[str, Any]:
    """The keyword arguments that stand for `prompt` in a call: the embeddings the pipeline's
    own encode_prompt makes by default (with classifier-free guidance's negative ones), so a
    later call needs no text encoder. Introduced in 11_fitting_your_gpu.ipynb."""
    if any(getattr(pipe, name, None) is None for name in TEXT_ENCODERS if hasattr(pipe, name)):
        raise FastdiffError("This pipeline's text encoders are gone: encode the prompts before "
                            "apply_memory_saver(pipe, 'text-encoders-freed').")
    device = pipeline_device(pipe)
    name = pipeline_spec(pipe).pipeline_class  # the class decides encode_prompt's signature
    with torch.no_grad():
        if name == "StableDiffusionXLPipeline":
            embeds, negative, pooled, negative_pooled = pipe.encode_prompt(prompt, device=device)
            return dict(prompt_embeds=embeds, negative_prompt_embeds=negative,
                        pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=negative_pooled)
        if name == "FluxPipeline":  # no negative prompt (guidance is an input); T5 at its length
            embeds, pooled, _ = pipe.encode_prompt(
                prompt, device=device, max_sequence_length=pipeline_spec(pipe).max_tokens)
            return dict(prompt_embeds=embeds, pooled_prompt_embeds=pooled)
        if name == "PixArtAlphaPipeline":
            embeds, mask, negative, negative_mask = pipe.encode_prompt(prompt, device=device)
            return dict(prompt_embeds=embeds, prompt_attention_mask=mask,
                        negative_prompt_embeds=negative,
                        negative_prompt_attention_mask=negative_mask)
        embeds, negative = pipe.encode_prompt(prompt, device, 1, True)
        return dict(prompt_embeds=embeds, negative_prompt_embeds=negative)


def apply_memory_saver(pipe, saver: str, prompt: str | None = None) -> dict[str, Any] | None:
    """Turn on one of MEMORY_SAVERS (see the module docstring). "text-encoders-freed" needs the
    `prompt` it will run with: it returns the embeddings to pass to the pipeline in its place
    (encode_prompt_once), after deleting the text encoders. Returns None otherwise.
    Introduced in 11_fitting_your_gpu.ipynb."""
    if saver not in MEMORY_SAVERS:
        raise FastdiffError(f"Unknown memory saver {saver!r}. Use one of: "
                            f"{', '.join(MEMORY_SAVERS)}.")
    # diffusers refuses the first two offloads itself ("requires accelerator", diffusers/
    # pipelines/pipeline_utils.py, enable_model_cpu_offload and enable_sequential_cpu_offload)
    if saver in OFFLOADS and not torch.cuda.is_available():
        raise FastdiffError(f"{saver} moves weights between CPU memory and a GPU; this machine "
                            "has no GPU, so there is nowhere to offload to (diffusers refuses "
                            "model and sequential offload without an accelerator). Run it on "
                            "a GPU machine, or try vae-slicing, vae-tiling or "
                            "text-encoders-freed here.")
    done = [s for s in OFFLOADS if s in applied(pipe).get("memory_savers", [])]
    if saver in OFFLOADS and done:
        raise FastdiffError(f"This pipeline already has {done[0]}; diffusers allows one offload "
                            "at a time: load a fresh pipeline for another.")
    out = None
    if saver == "text-encoders-freed":
        if not isinstance(prompt, str):
            raise FastdiffError("text-encoders-freed needs the prompt it will run with: "
                                "apply_memory_saver(pipe, 'text-encoders-freed', prompt='...'); "
                                "pass the embeddings it returns to the pipeline.")
        out = encode_prompt_once(pipe, prompt)
        for name in TEXT_ENCODERS:
            if hasattr(pipe, name):
                setattr(pipe, name, None)
    elif saver == "group-offload":
        pipe.enable_group_offload(onload_device=torch.device("cuda"),
                                  offload_device=torch.device("cpu"), offload_type="block_level",
                                  num_blocks_per_group=1, use_stream=True)
    else:  # one diffusers call with no arguments
        {"vae-slicing": pipe.vae.enable_slicing, "vae-tiling": pipe.vae.enable_tiling,
         "model-offload": pipe.enable_model_cpu_offload,
         "sequential-offload": pipe.enable_sequential_cpu_offload}[saver]()
    record(pipe, "memory_savers", applied(pipe).get("memory_savers", []) + [saver])
    return out
