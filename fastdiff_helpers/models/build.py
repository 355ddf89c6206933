"""Pipelines built in code: full-size architectures with random weights, and tiny ones.

Introduced in 00_setup.ipynb (through fdh.load_pipeline). diffusers, transformers, tokenizers
and accelerate are imported inside the functions: importing them takes seconds, and
`import fastdiff_helpers` must stay cheap (tests/test_env.py).
"""

from __future__ import annotations

import string
from contextlib import contextmanager
from typing import Any

import torch

from .noise import quiet_known_noise
from .presets import Component, ModelSpec


def clip_tokenizer(model_max_length: int = 77):
    """A byte-level CLIP BPE tokenizer built in code: every byte is a token, no merges.

    Token ids stay below 514, valid for any CLIP text encoder (tiny or full-size)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    chars = sorted(ByteLevel.alphabet())
    tokens = ["<|startoftext|>", "<|endoftext|>", *chars, *(c + "</w>" for c in chars)]
    vocab = {token: i for i, token in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def t5_tokenizer(model_max_length: int = 120):
    """A small unigram T5 tokenizer built in code (letters, digits, punctuation)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("\u2581" + c, -2.5) for c in string.ascii_lowercase]
    return T5Tokenizer(vocab=pieces, extra_ids=100, model_max_length=model_max_length)


def _instantiate(comp: Component):
    # before diffusers or transformers (and torchao through diffusers) is first imported: a
    # build on the meta device (fdh.weight_bytes, the plan, `download`) may be the first
    quiet_known_noise()
    if comp.library == "diffusers":
        import diffusers
        return getattr(diffusers, comp.class_name).from_config(dict(comp.config))
    import transformers
    config = getattr(transformers, comp.config_class)(**comp.config)
    return getattr(transformers, comp.class_name)(config)


@torch.no_grad()
def _init_parameters(module: torch.nn.Module, seed: int) -> None:
    """Seeded random init, on whatever device the parameters live.

    Layers with a reset_parameters() use it (kaiming for Linear/Conv, ones/zeros for norms);
    any other parameter gets ones (1-D weights: norm scales), zeros (biases) or N(0, 0.02)."""
    devices = [p.device for p in module.parameters() if p.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.manual_seed(seed)
        covered: set[int] = set()
        for sub in module.modules():
            own = list(sub.parameters(recurse=False))
            if own and callable(getattr(sub, "reset_parameters", None)):
                sub.reset_parameters()
                covered.update(id(p) for p in own)
        for name, p in module.named_parameters():
            if id(p) in covered:
                continue
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)


@contextmanager
def quiet_diffusers():
    """Quiet diffusers around our own casts of models we just built: ModelMixin.to warns on
    every dtype cast that modules "should be kept in float32", even where there are none
    (diffusers/models/modeling_utils.py, ModelMixin.to: `fp32_modules = self.
    _keep_in_fp32_modules or []`, then `if dtype_present_in_args and fp32_modules is not
    None`, true for the empty list), a line per model and cast a participant cannot act on."""
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(level)


def cast_built(built, dtype: torch.dtype):
    """A model or pipeline we just built, cast to `dtype` without diffusers' warning (quiet_
    diffusers): tiny weights are drawn in fp32, so every dtype gets them rounded."""
    with quiet_diffusers():
        built.to(dtype=dtype)
    return built


def build_component(comp: Component, device: str, dtype: torch.dtype, seed: int = 0):
    """Build one component with random weights: parameters on the meta device first, then
    materialised and initialised directly on `device` (no CPU copy of a 4.8B model).

    device="meta" returns the architecture without allocating parameter memory."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # buffers (position ids...) stay real
        model = _instantiate(comp)
    if dtype != torch.float32:
        cast_built(model, dtype)
    if device != "meta":
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        model.to_empty(device=device)
        for name, value in buffers.items():
            owner, _, leaf = name.rpartition(".")  # owner "": get_submodule gives the model
            setattr(model.get_submodule(owner), leaf, value.to(device))  # a buffer stays one
        _init_parameters(model, seed)
    # transformers ties shared embeddings (T5's shared/embed_tokens) in from_pretrained, not in
    # the constructor; materialising with to_empty() unties them again.
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def build_scheduler(comp: Component):
    """The scheduler a preset names, made from its config (no weights, no files)."""
    return _instantiate(comp)


def build_pipeline(spec: ModelSpec, size: str, device: str, dtype: torch.dtype, seed: int):
    comps = spec.full if size == "full" else spec.tiny
    parts: dict[str, Any] = {name: build_component(comp, device, dtype, seed + i)
                             for i, (name, comp) in enumerate(comps.items())}
    for name, kind in spec.tokenizers.items():
        parts[name] = clip_tokenizer() if kind == "clip" else t5_tokenizer(spec.max_tokens)
    parts["scheduler"] = build_scheduler(spec.scheduler)
    parts.update(spec.pipeline_kwargs)
    import diffusers  # only now: _instantiate has called quiet_known_noise() before it
    return getattr(diffusers, spec.pipeline_class)(**parts)
