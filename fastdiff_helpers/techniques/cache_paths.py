"""The denoiser cut in two for a step cache: a full path that also returns the deep features,
and a cached path that recomputes only the shallow branch around features kept from the last
full step.

Introduced in 09_fewer_denoiser_calls.ipynb. Written against diffusers 0.42.1's forwards, for the
inputs the course's pipelines pass (anything else is refused by the step cache):
- UNet2DConditionModel.forward (models/unets/unet_2d_condition.py:979): DeepCache's idea (Ma et
  al., arXiv 2312.00858) at the granularity of the UNet's blocks. `branch` = b keeps conv_in, the
  first b down blocks, the last b up blocks and conv_out on every step; the deep feature is the
  input of up block len(up_blocks) - b, computed on full steps only.
- PixArtTransformer2DModel.forward (models/transformers/pixart_transformer_2d.py:227): a block
  cache written by hand (the course's own): the first `branch` blocks run every step; the other
  blocks run on full steps only, and a cached step adds their last residual (their output minus
  their input) to the fresh output of the first blocks. By hand because diffusers' Pyramid
  Attention Broadcast, which does attach to PixArt's attention, keeps its step count on the
  module, so a compiled transformer recompiles on every step (pinned in
  tests/test_fewer_calls.py).
- FluxTransformer2DModel.forward: the same block cache over Flux's double- and single-stream
  blocks (the last section).
Each full path computes exactly the ops of the library's forward (tests compare the images).

Flux.1's transformer: the course's own block cache (as PixArt's), over Flux's two kinds of
blocks.

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

# --- UNet ----------------------------------------------------------------------------------------

def unet_branches(unet) -> int:
    """The largest `branch` a UNet takes: one level fewer than it has (the deepest level and
    the mid block are what a cached step skips)."""
    return len(unet.up_blocks) - 1


def _unet_prepare(unet, sample, timestep, encoder_hidden_states, timestep_cond,
                  attention_mask, added_cond_kwargs, encoder_attention_mask):
    # unet_2d_condition.py, forward: masks, time and added embeddings, encoder states
    upsample_factor = 2 ** unet.num_upsamplers
    forward_upsample_size = any(dim % upsample_factor != 0 for dim in sample.shape[-2:])
    if attention_mask is not None:
        attention_mask = ((1 - attention_mask.to(sample.dtype)) * -10000.0).unsqueeze(1)
    if encoder_attention_mask is not None:
        encoder_attention_mask = ((1 - encoder_attention_mask.to(sample.dtype))
                                  * -10000.0).unsqueeze(1)
    if unet.config.center_input_sample:
        sample = 2 * sample - 1.0
    t_emb = unet.get_time_embed(sample=sample, timestep=timestep)
    emb = unet.time_embedding(t_emb, timestep_cond)
    aug_emb = unet.get_aug_embed(emb=emb, encoder_hidden_states=encoder_hidden_states,
                                 added_cond_kwargs=added_cond_kwargs)
    emb = emb + aug_emb if aug_emb is not None else emb
    if unet.time_embed_act is not None:
        emb = unet.time_embed_act(emb)
    encoder_hidden_states = unet.process_encoder_hidden_states(
        encoder_hidden_states=encoder_hidden_states, added_cond_kwargs=added_cond_kwargs)
    context = dict(emb=emb, encoder_hidden_states=encoder_hidden_states,
                   attention_mask=attention_mask, encoder_attention_mask=encoder_attention_mask)
    return unet.conv_in(sample), context, forward_upsample_size


def _down(block, sample, c, cross_attention_kwargs):
    if getattr(block, "has_cross_attention", False):
        return block(hidden_states=sample, temb=c["emb"],
                     encoder_hidden_states=c["encoder_hidden_states"],
                     attention_mask=c["attention_mask"],
                     cross_attention_kwargs=cross_attention_kwargs,
                     encoder_attention_mask=c["encoder_attention_mask"])
    return block(hidden_states=sample, temb=c["emb"])


def _up(unet, i, sample, res, c, cross_attention_kwargs, forward_upsample_size):
    block = unet.up_blocks[i]
    n = len(block.resnets)
    res_samples, res = res[-n:], res[:-n]
    upsample_size = None
    if i < len(unet.up_blocks) - 1 and forward_upsample_size:
        upsample_size = res[-1].shape[2:]
    if getattr(block, "has_cross_attention", False):
        sample = block(hidden_states=sample, temb=c["emb"], res_hidden_states_tuple=res_samples,
                       encoder_hidden_states=c["encoder_hidden_states"],
                       cross_attention_kwargs=cross_attention_kwargs,
                       upsample_size=upsample_size, attention_mask=c["attention_mask"],
                       encoder_attention_mask=c["encoder_attention_mask"])
    else:
        sample = block(hidden_states=sample, temb=c["emb"], res_hidden_states_tuple=res_samples,
                       upsample_size=upsample_size)
    return sample, res


def _unet_out(unet, sample):
    if unet.conv_norm_out is not None:
        sample = unet.conv_act(unet.conv_norm_out(sample))
    return unet.conv_out(sample)


def unet_full(unet, branch: int, sample, timestep, encoder_hidden_states, timestep_cond=None,
              attention_mask=None, cross_attention_kwargs=None, added_cond_kwargs=None,
              encoder_attention_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The UNet's whole forward: (noise prediction, deep feature for the cached steps)."""
    sample, c, fus = _unet_prepare(unet, sample, timestep, encoder_hidden_states, timestep_cond,
                                   attention_mask, added_cond_kwargs, encoder_attention_mask)
    res: tuple = (sample,)
    for block in unet.down_blocks:
        sample, more = _down(block, sample, c, cross_attention_kwargs)
        res += more
    if unet.mid_block is not None:
        if getattr(unet.mid_block, "has_cross_attention", False):
            sample = unet.mid_block(sample, c["emb"],
                                    encoder_hidden_states=c["encoder_hidden_states"],
                                    attention_mask=c["attention_mask"],
                                    cross_attention_kwargs=cross_attention_kwargs,
                                    encoder_attention_mask=c["encoder_attention_mask"])
        else:
            sample = unet.mid_block(sample, c["emb"])
    deep_at = len(unet.up_blocks) - branch
    feature = sample
    for i in range(len(unet.up_blocks)):
        if i == deep_at:
            feature = sample
        sample, res = _up(unet, i, sample, res, c, cross_attention_kwargs, fus)
    return _unet_out(unet, sample), feature


def unet_cached(unet, branch: int, feature, sample, timestep, encoder_hidden_states,
                timestep_cond=None, attention_mask=None, cross_attention_kwargs=None,
                added_cond_kwargs=None, encoder_attention_mask=None) -> torch.Tensor:
    """The shallow branch only: the first `branch` down blocks, then the last `branch` up
    blocks from the cached deep feature. (The last shallow down block runs whole, its
    downsampler too, whose output no shallow up block reads: block-level granularity.
    count_flops counts it, as computed.)"""
    sample, c, fus = _unet_prepare(unet, sample, timestep, encoder_hidden_states, timestep_cond,
                                   attention_mask, added_cond_kwargs, encoder_attention_mask)
    res: tuple = (sample,)
    for block in unet.down_blocks[:branch]:
        sample, more = _down(block, sample, c, cross_attention_kwargs)
        res += more
    deep_at = len(unet.up_blocks) - branch
    res = res[:sum(len(b.resnets) for b in unet.up_blocks[deep_at:])]
    sample = feature
    for i in range(deep_at, len(unet.up_blocks)):
        sample, res = _up(unet, i, sample, res, c, cross_attention_kwargs, fus)
    return _unet_out(unet, sample)


# --- PixArt -------------------------------------------------------------------------------

def pixart_branches(transformer) -> int:
    """The largest `branch` a PixArt transformer takes: all blocks but one."""
    return len(transformer.transformer_blocks) - 1


def _pixart_prepare(t, hidden_states, encoder_hidden_states, timestep, added_cond_kwargs,
                    attention_mask, encoder_attention_mask):
    # pixart_transformer_2d.py, forward: masks, patch embedding, adaLN timestep, captions
    if t.use_additional_conditions and added_cond_kwargs is None:
        raise ValueError("`added_cond_kwargs` cannot be None when using additional conditions "
                         "for `adaln_single`.")
    if attention_mask is not None and attention_mask.ndim == 2:
        attention_mask = ((1 - attention_mask.to(hidden_states.dtype)) * -10000.0).unsqueeze(1)
    if encoder_attention_mask is not None and encoder_attention_mask.ndim == 2:
        encoder_attention_mask = ((1 - encoder_attention_mask.to(hidden_states.dtype))
                                  * -10000.0).unsqueeze(1)
    batch_size = hidden_states.shape[0]
    size = (hidden_states.shape[-2] // t.config.patch_size,
            hidden_states.shape[-1] // t.config.patch_size)
    hidden_states = t.pos_embed(hidden_states)
    timestep, embedded_timestep = t.adaln_single(timestep, added_cond_kwargs,
                                                 batch_size=batch_size,
                                                 hidden_dtype=hidden_states.dtype)
    if t.caption_projection is not None:
        encoder_hidden_states = t.caption_projection(encoder_hidden_states)
        encoder_hidden_states = encoder_hidden_states.view(batch_size, -1,
                                                           hidden_states.shape[-1])
    context = dict(attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
                   encoder_attention_mask=encoder_attention_mask, timestep=timestep)
    return hidden_states, context, embedded_timestep, size


def _blocks(blocks, hidden_states, c, cross_attention_kwargs):
    for block in blocks:
        hidden_states = block(hidden_states, cross_attention_kwargs=cross_attention_kwargs,
                              class_labels=None, **c)
    return hidden_states


def _pixart_out(t, hidden_states, embedded_timestep, size):
    height, width = size
    p = t.config.patch_size
    shift, scale = (t.scale_shift_table[None]
                    + embedded_timestep[:, None].to(t.scale_shift_table.device)).chunk(2, dim=1)
    hidden_states = t.norm_out(hidden_states)
    hidden_states = (hidden_states * (1 + scale.to(hidden_states.device))
                     + shift.to(hidden_states.device))
    hidden_states = t.proj_out(hidden_states).squeeze(1)
    hidden_states = hidden_states.reshape(shape=(-1, height, width, p, p, t.out_channels))
    hidden_states = torch.einsum("nhwpqc->nchpwq", hidden_states)
    return hidden_states.reshape(shape=(-1, t.out_channels, height * p, width * p))


def pixart_full(t, branch: int, hidden_states, encoder_hidden_states=None, timestep=None,
                added_cond_kwargs: Any = None, cross_attention_kwargs=None,
                attention_mask=None, encoder_attention_mask=None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's whole forward: (prediction, residual of the blocks after `branch`)."""
    hidden_states, c, embedded, size = _pixart_prepare(
        t, hidden_states, encoder_hidden_states, timestep, added_cond_kwargs, attention_mask,
        encoder_attention_mask)
    blocks = t.transformer_blocks
    shallow = _blocks(blocks[:branch], hidden_states, c, cross_attention_kwargs)
    deep = _blocks(blocks[branch:], shallow, c, cross_attention_kwargs)
    return _pixart_out(t, deep, embedded, size), deep - shallow


def pixart_cached(t, branch: int, feature, hidden_states, encoder_hidden_states=None,
                  timestep=None, added_cond_kwargs: Any = None, cross_attention_kwargs=None,
                  attention_mask=None, encoder_attention_mask=None) -> torch.Tensor:
    """The first `branch` blocks, then the cached residual of the others."""
    hidden_states, c, embedded, size = _pixart_prepare(
        t, hidden_states, encoder_hidden_states, timestep, added_cond_kwargs, attention_mask,
        encoder_attention_mask)
    shallow = _blocks(t.transformer_blocks[:branch], hidden_states, c, cross_attention_kwargs)
    return _pixart_out(t, shallow + feature, embedded, size)


# --- Flux.1's transformer ------------------------------------------------------------------------

def flux_branches(transformer) -> int:
    """The largest `branch` a Flux transformer takes: all blocks, double and single, but one."""
    return len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks) - 1


def _flux_prepare(t, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids,
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


def _flux_blocks(t) -> list:
    return [*t.transformer_blocks, *t.single_transformer_blocks]


def _flux_run(blocks, hidden_states, encoder_hidden_states, temb, rotary, joint_attention_kwargs):
    for block in blocks:
        encoder_hidden_states, hidden_states = block(
            hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, temb=temb,
            image_rotary_emb=rotary, joint_attention_kwargs=joint_attention_kwargs)
    return hidden_states, encoder_hidden_states


def _flux_out(t, hidden_states, temb):
    return t.proj_out(t.norm_out(hidden_states, temb))


def flux_full(t, branch: int, hidden_states, encoder_hidden_states=None,
              pooled_projections=None, timestep=None, img_ids=None, txt_ids=None, guidance=None,
              joint_attention_kwargs: Any = None, controlnet_blocks_repeat: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's whole forward: (prediction, image-stream residual of the blocks after
    the first `branch`)."""
    hidden, encoder, temb, rotary = _flux_prepare(t, hidden_states, encoder_hidden_states,
                                             pooled_projections, timestep, img_ids, txt_ids,
                                             guidance)
    blocks = _flux_blocks(t)
    shallow, encoder = _flux_run(blocks[:branch], hidden, encoder, temb, rotary,
                            joint_attention_kwargs)
    deep, _ = _flux_run(blocks[branch:], shallow, encoder, temb, rotary, joint_attention_kwargs)
    return _flux_out(t, deep, temb), deep - shallow


def flux_cached(t, branch: int, feature, hidden_states, encoder_hidden_states=None,
                pooled_projections=None, timestep=None, img_ids=None, txt_ids=None,
                guidance=None, joint_attention_kwargs: Any = None,
                controlnet_blocks_repeat: bool = False) -> torch.Tensor:
    """The first `branch` blocks, then the kept residual of the others."""
    hidden, encoder, temb, rotary = _flux_prepare(t, hidden_states, encoder_hidden_states,
                                             pooled_projections, timestep, img_ids, txt_ids,
                                             guidance)
    shallow, _ = _flux_run(_flux_blocks(t)[:branch], hidden, encoder, temb, rotary,
                      joint_attention_kwargs)
    return _flux_out(t, shallow + feature, temb)


PATHS = {"unet": (unet_full, unet_cached, unet_branches),
         "transformer": (pixart_full, pixart_cached, pixart_branches),
         "flux": (flux_full, flux_cached, flux_branches)}
