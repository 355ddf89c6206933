"""The step cache's two paths for Flux.1's transformer, the course's own block cache (as
PixArt's in cache_paths.py), over Flux's two kinds of blocks.

Introduced in 19_flux.ipynb. Written against FluxTransformer2DModel.forward in diffusers 0.42.1
(models/transformers/transformer_flux.py:671-821), for the inputs FluxPipeline passes (the step
cache refuses ControlNet samples and IP-Adapter embeddings). The blocks run in the forward's
order, the 19 double-stream blocks (FluxTransformerBlock: image and text streams apart) then
the 38 single-stream ones (FluxSingleTransformerBlock: the two concatenated); all take and
return (text stream, image stream). `branch` = b runs the first b of that sequence on every
step. A full step runs the rest too and keeps their residual on the image stream (their output
minus their input), which is all the output reads (norm_out and proj_out take the image
stream alone, transformer_flux.py:815-816); a cached step adds the kept residual to the fresh
output of the first b blocks. diffusers' FirstBlockCache keeps the same kind of residual, but
decides per step on the host (19_flux.ipynb compares the two). The full path computes exactly
the library's forward (tested).
"""

from __future__ import annotations

from typing import Any

import torch


def flux_branches(transformer) -> int:
    """The largest `branch` a Flux transformer takes: all blocks, double and single, but one."""
    return len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks) - 1


def _prepare(t, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids,
             txt_ids, guidance):
    # transformer_flux.py:723-750: embeddings, the timestep (and dev's guidance) embedding,
    # the rotary embedding of the text and image positions
    hidden_states = t.x_embedder(hidden_states)
    timestep = timestep.to(hidden_states.dtype) * 1000
    if guidance is not None:
        guidance = guidance.to(hidden_states.dtype) * 1000
    temb = (t.time_text_embed(timestep, pooled_projections) if guidance is None
            else t.time_text_embed(timestep, guidance, pooled_projections))
    encoder_hidden_states = t.context_embedder(encoder_hidden_states)
    txt_ids = txt_ids[0] if txt_ids.ndim == 3 else txt_ids  # the library's deprecated 3-D ids
    img_ids = img_ids[0] if img_ids.ndim == 3 else img_ids
    rotary = t.pos_embed(torch.cat((txt_ids, img_ids), dim=0))
    return hidden_states, encoder_hidden_states, temb, rotary


def _blocks(t) -> list:
    return [*t.transformer_blocks, *t.single_transformer_blocks]


def _run(blocks, hidden_states, encoder_hidden_states, temb, rotary, joint_attention_kwargs):
    for block in blocks:
        encoder_hidden_states, hidden_states = block(
            hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, temb=temb,
            image_rotary_emb=rotary, joint_attention_kwargs=joint_attention_kwargs)
    return hidden_states, encoder_hidden_states


def _out(t, hidden_states, temb):
    return t.proj_out(t.norm_out(hidden_states, temb))


def flux_full(t, branch: int, hidden_states, encoder_hidden_states=None,
              pooled_projections=None, timestep=None, img_ids=None, txt_ids=None, guidance=None,
              joint_attention_kwargs: Any = None, controlnet_blocks_repeat: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's whole forward: (prediction, image-stream residual of the blocks after
    the first `branch`)."""
    hidden, encoder, temb, rotary = _prepare(t, hidden_states, encoder_hidden_states,
                                             pooled_projections, timestep, img_ids, txt_ids,
                                             guidance)
    blocks = _blocks(t)
    shallow, encoder = _run(blocks[:branch], hidden, encoder, temb, rotary,
                            joint_attention_kwargs)
    deep, _ = _run(blocks[branch:], shallow, encoder, temb, rotary, joint_attention_kwargs)
    return _out(t, deep, temb), deep - shallow


def flux_cached(t, branch: int, feature, hidden_states, encoder_hidden_states=None,
                pooled_projections=None, timestep=None, img_ids=None, txt_ids=None,
                guidance=None, joint_attention_kwargs: Any = None,
                controlnet_blocks_repeat: bool = False) -> torch.Tensor:
    """The first `branch` blocks, then the kept residual of the others."""
    hidden, encoder, temb, rotary = _prepare(t, hidden_states, encoder_hidden_states,
                                             pooled_projections, timestep, img_ids, txt_ids,
                                             guidance)
    shallow, _ = _run(_blocks(t)[:branch], hidden, encoder, temb, rotary,
                      joint_attention_kwargs)
    return _out(t, shallow + feature, temb)
