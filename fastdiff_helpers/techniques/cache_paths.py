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
- FluxTransformer2DModel.forward (models/transformers/transformer_flux.py:671-821): the same
  block cache over the forward's blocks in order, the 19 double-stream blocks
  (FluxTransformerBlock: image and text streams apart) then the 38 single-stream ones
  (FluxSingleTransformerBlock: the two concatenated); all take and return (text stream, image
  stream). The residual kept is the image stream's, which is all the output reads (norm_out
  and proj_out take the image stream alone, transformer_flux.py:815-816). diffusers'
  FirstBlockCache keeps the same kind of residual, but decides per step on the host
  (19_flux.ipynb compares the two). Introduced in 19_flux.ipynb.
Each full path computes exactly the ops of the library's forward (tests compare the images).
"""

from __future__ import annotations

from typing import Any

import torch

# --- UNet ----------------------------------------------------------------------------------------

def _unet_down(unet, count: int, sample, timestep, encoder_hidden_states, timestep_cond=None,
               attention_mask=None, cross_attention_kwargs=None, added_cond_kwargs=None,
               encoder_attention_mask=None) -> tuple[torch.Tensor, tuple, dict]:
    # unet_2d_condition.py, forward: masks, time and added embeddings, encoder states, then the
    # first `count` down blocks; (sample, the down blocks' residuals, what later blocks take)
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
    c = dict(emb=emb, upsample=forward_upsample_size, cross=dict(
        encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask,
        cross_attention_kwargs=cross_attention_kwargs,
        encoder_attention_mask=encoder_attention_mask))
    sample = unet.conv_in(sample)
    res: tuple = (sample,)
    for block in unet.down_blocks[:count]:
        sample, more = _block(block, c, hidden_states=sample)
        res += more
    return sample, res, c


def _block(block, c, **kwargs):
    # a down, mid or up block as the forward calls it: the cross-attention inputs only to the
    # blocks that have cross-attention
    if getattr(block, "has_cross_attention", False):
        kwargs.update(c["cross"])
    return block(temb=c["emb"], **kwargs)


def _up(unet, i, sample, res, c):
    block = unet.up_blocks[i]
    n = len(block.resnets)
    res_samples, res = res[-n:], res[:-n]
    upsample_size = res[-1].shape[2:] if i < len(unet.up_blocks) - 1 and c["upsample"] else None
    sample = _block(block, c, hidden_states=sample, res_hidden_states_tuple=res_samples,
                    upsample_size=upsample_size)
    return sample, res


def _unet_out(unet, start: int, sample, res, c) -> torch.Tensor:
    # the up blocks from `start` on, then the output layers
    for i in range(start, len(unet.up_blocks)):
        sample, res = _up(unet, i, sample, res, c)
    if unet.conv_norm_out is not None:
        sample = unet.conv_act(unet.conv_norm_out(sample))
    return unet.conv_out(sample)


def unet_full(unet, branch: int, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The UNet's whole forward: (noise prediction, deep feature for the cached steps)."""
    sample, res, c = _unet_down(unet, len(unet.down_blocks), **inputs)
    if unet.mid_block is not None:
        sample = _block(unet.mid_block, c, hidden_states=sample)
    deep_at = len(unet.up_blocks) - branch
    for i in range(deep_at):
        sample, res = _up(unet, i, sample, res, c)
    return _unet_out(unet, deep_at, sample, res, c), sample


def unet_cached(unet, branch: int, feature, **inputs: Any) -> torch.Tensor:
    """The shallow branch around the cached deep feature. The last shallow down block runs
    whole, its downsampler too, whose output no shallow up block reads (block-level
    granularity; count_flops counts it, as computed)."""
    _, res, c = _unet_down(unet, branch, **inputs)
    deep_at = len(unet.up_blocks) - branch
    res = res[:sum(len(b.resnets) for b in unet.up_blocks[deep_at:])]
    return _unet_out(unet, deep_at, feature, res, c)


# --- PixArt -------------------------------------------------------------------------------

def _pixart_prepare(t, hidden_states, encoder_hidden_states=None, timestep=None,
                    added_cond_kwargs: Any = None, cross_attention_kwargs=None,
                    attention_mask=None, encoder_attention_mask=None):
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
                   encoder_attention_mask=encoder_attention_mask, timestep=timestep,
                   cross_attention_kwargs=cross_attention_kwargs, class_labels=None)
    return hidden_states, context, embedded_timestep, size


def _blocks(blocks, hidden_states, c):
    for block in blocks:
        hidden_states = block(hidden_states, **c)
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


def pixart_full(t, branch: int, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's whole forward: (prediction, residual of the blocks after `branch`)."""
    hidden_states, c, embedded, size = _pixart_prepare(t, **inputs)
    shallow = _blocks(t.transformer_blocks[:branch], hidden_states, c)
    deep = _blocks(t.transformer_blocks[branch:], shallow, c)
    return _pixart_out(t, deep, embedded, size), deep - shallow


def pixart_cached(t, branch: int, feature, **inputs: Any) -> torch.Tensor:
    """The first `branch` blocks, then the cached residual of the others."""
    hidden_states, c, embedded, size = _pixart_prepare(t, **inputs)
    shallow = _blocks(t.transformer_blocks[:branch], hidden_states, c)
    return _pixart_out(t, shallow + feature, embedded, size)


# --- Flux.1's transformer ------------------------------------------------------------------------

def _flux_prepare(t, hidden_states, encoder_hidden_states=None, pooled_projections=None,
                  timestep=None, img_ids=None, txt_ids=None, guidance=None,
                  joint_attention_kwargs: Any = None, controlnet_blocks_repeat: bool = False):
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
    context = dict(temb=temb, image_rotary_emb=rotary,
                   joint_attention_kwargs=joint_attention_kwargs)
    return hidden_states, encoder_hidden_states, context


def _flux_run(blocks, hidden_states, encoder_hidden_states, c):
    for block in blocks:
        encoder_hidden_states, hidden_states = block(
            hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, **c)
    return hidden_states, encoder_hidden_states


def flux_full(t, branch: int, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's whole forward: (prediction, image-stream residual of the blocks after
    the first `branch`)."""
    hidden, encoder, c = _flux_prepare(t, **inputs)
    blocks = [*t.transformer_blocks, *t.single_transformer_blocks]
    shallow, encoder = _flux_run(blocks[:branch], hidden, encoder, c)
    deep, _ = _flux_run(blocks[branch:], shallow, encoder, c)
    return t.proj_out(t.norm_out(deep, c["temb"])), deep - shallow


def flux_cached(t, branch: int, feature, **inputs: Any) -> torch.Tensor:
    """The first `branch` blocks, then the kept residual of the others."""
    hidden, encoder, c = _flux_prepare(t, **inputs)
    blocks = [*t.transformer_blocks, *t.single_transformer_blocks]
    shallow, _ = _flux_run(blocks[:branch], hidden, encoder, c)
    return t.proj_out(t.norm_out(shallow + feature, c["temb"]))


# Each family's full path, cached path and largest `branch`: a UNet's is one level fewer than it
# has (the deepest level and the mid block are what a cached step skips); PixArt's and Flux's,
# all blocks but one (Flux's double- and single-stream blocks together).
PATHS = {"unet": (unet_full, unet_cached, lambda unet: len(unet.up_blocks) - 1),
         "transformer": (pixart_full, pixart_cached, lambda t: len(t.transformer_blocks) - 1),
         "flux": (flux_full, flux_cached,
                  lambda t: len(t.transformer_blocks) + len(t.single_transformer_blocks) - 1)}
