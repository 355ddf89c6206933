"""load_pipeline(): one loading path for pretrained, random (full-size) and tiny weights.

Introduced in 00_setup.ipynb.
"""

from __future__ import annotations

import os
import string
from contextlib import contextmanager
from typing import Any

import torch

from .presets import SCHEDULERS, VAES, Component, ModelSpec, get_spec

WEIGHTS = ("auto", "pretrained", "random", "tiny")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class FastdiffError(ValueError):
    """An input or environment problem, with a message that says what to do next."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise FastdiffError(f"Unknown dtype {dtype!r} for loading. Use one of "
                        f"{', '.join(DTYPES)} (TF32 is a matmul setting, not a weight dtype: "
                        "load in fp32 and use fdh.set_precision(pipe, 'tf32')).")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --- tokenizers built in code (no download) ----------------------------------------------

def clip_tokenizer(model_max_length: int = 77):
    """A byte-level CLIP BPE tokenizer built in code: every byte is a token, no merges.

    Token ids stay below 514, valid for any CLIP text encoder (tiny or full-size)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    chars = sorted(ByteLevel.alphabet())
    for suffix in ("", "</w>"):
        for c in chars:
            vocab[c + suffix] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def t5_tokenizer(model_max_length: int = 120):
    """A small unigram T5 tokenizer built in code (letters, digits, punctuation)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("\u2581" + c, -2.5) for c in string.ascii_lowercase]
    return T5Tokenizer(vocab=pieces, extra_ids=100, model_max_length=model_max_length)


# --- components built in code ------------------------------------------------------------

def _component_class(comp: Component):
    if comp.library == "diffusers":
        import diffusers
        return getattr(diffusers, comp.class_name)
    import transformers
    return getattr(transformers, comp.class_name)


def _instantiate(comp: Component):
    cls = _component_class(comp)
    if comp.library == "diffusers":
        return cls.from_config(dict(comp.config))
    import transformers
    return cls(getattr(transformers, comp.config_class)(**comp.config))


def _tie(model):
    # transformers ties shared embeddings (T5's shared/embed_tokens) in from_pretrained, not in
    # the constructor; materialising with to_empty() unties them again.
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


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
            if hasattr(sub, "reset_parameters") and callable(sub.reset_parameters):
                own = list(sub.parameters(recurse=False))
                if own:
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
    """diffusers logs a warning on every .to(dtype) about fp32-pinned modules (none here)."""
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(level)


def build_component(comp: Component, device: str, dtype: torch.dtype, seed: int = 0):
    """Build one component with random weights: parameters on the meta device first, then
    materialised and initialised directly on `device` (no CPU copy of a 4.8B model).

    device="meta" returns the architecture without allocating parameter memory."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # buffers (position ids...) stay real
        model = _instantiate(comp)
    if dtype != torch.float32:
        with quiet_diffusers():
            model.to(dtype)
    if device != "meta":
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        model.to_empty(device=device)
        for name, value in buffers.items():
            owner, _, leaf = name.rpartition(".")
            target = model.get_submodule(owner) if owner else model
            target._buffers[leaf] = value.to(device)
        _init_parameters(model, seed)
    return _tie(model).eval()


def _build_scheduler(comp: Component):
    return _component_class(comp).from_config(dict(comp.config))


def _build_pipeline(spec: ModelSpec, size: str, device: str, dtype: torch.dtype, seed: int):
    import diffusers

    comps = spec.full if size == "full" else spec.tiny
    parts: dict[str, Any] = {}
    for i, (name, comp) in enumerate(comps.items()):
        parts[name] = build_component(comp, device, dtype, seed + i)
    for name, kind in spec.tokenizers.items():
        parts[name] = clip_tokenizer() if kind == "clip" else t5_tokenizer(spec.max_tokens)
    parts["scheduler"] = _build_scheduler(spec.scheduler)
    parts.update(spec.pipeline_kwargs)
    return getattr(diffusers, spec.pipeline_class)(**parts)


# --- pretrained --------------------------------------------------------------------------

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
    holds no safetensors weights that from_pretrained would load: no variant (".fp16."),
    a single file or shards (a snapshot holds only what was downloaded; a file there is a
    link to a blob, which must exist)."""
    missing = []
    for name in spec.full:
        folder = os.path.join(snapshot, name)
        files = os.listdir(folder) if os.path.isdir(folder) else []
        if not any(f.endswith(".safetensors") and "." not in f[:-len(".safetensors")]
                   and os.path.exists(os.path.join(folder, f)) for f in files):
            missing.append(name)
    return missing


def _load_pretrained(spec: ModelSpec, path: str | None, dtype: torch.dtype):
    import diffusers

    ok, why = pretrained_status(spec, path)
    if not ok:
        if path is not None:
            raise FastdiffError(f"Cannot load {spec.key!r} from {path!r}: {why}. Pass a folder "
                                "written by pipe.save_pretrained() or by `hf download "
                                f"{spec.hub_id} --local-dir DIR`.")
        raise FastdiffError(
            f"Pretrained weights for {spec.key!r} are not available: {why}. On a machine with "
            f"network run `hf download {spec.hub_id}` (or pass path= a local copy), or use "
            "weights='random' (full-size architecture, random weights: real speed and memory) "
            "or weights='tiny' (small CPU model).")
    cls = getattr(diffusers, spec.pipeline_class)
    kwargs: dict[str, Any] = dict(torch_dtype=dtype, use_safetensors=True)
    if spec.key == "sd15":
        kwargs.update(safety_checker=None, requires_safety_checker=False)
    try:
        return cls.from_pretrained(path or spec.hub_id, **kwargs)
    except OSError as exc:
        raise FastdiffError(f"Loading {spec.key!r} from {path or spec.hub_id} failed: {exc}. "
                            "Only safetensors weights are loaded; check the folder holds "
                            "*.safetensors files for every component.") from None


# --- the public entry point --------------------------------------------------------------

def _check_swaps(vae: str | None, scheduler: str | None) -> None:
    if vae is not None and vae not in VAES:
        raise FastdiffError(f"Unknown vae {vae!r}. Use one of: {', '.join(VAES)} (or None for "
                            "the pipeline's own).")
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise FastdiffError(f"Unknown scheduler {scheduler!r}. Use one of: "
                            f"{', '.join(SCHEDULERS)} (or None for the pipeline's own).")


def _swap_vae(pipe, vae: str, weights: str, device: str, dtype: torch.dtype, seed: int) -> str:
    """Put the named VAE in place of the pipeline's own; returns where it came from."""
    hub_id, full, tiny = VAES[vae]
    if weights == "pretrained":
        from diffusers import AutoencoderKL

        try:
            pipe.vae = AutoencoderKL.from_pretrained(hub_id, torch_dtype=dtype,
                                                     use_safetensors=True).to(device)
        except OSError as exc:
            raise FastdiffError(f"Loading the {vae} VAE ({hub_id}) failed: {exc}. Run `hf "
                                f"download {hub_id}` on a machine with network, or load without "
                                "vae=.") from None
        return hub_id
    component = full if weights == "random" else tiny
    pipe.vae = build_component(component, device, dtype, seed + 100)
    return f"{hub_id} (config; {weights} weights)"


def load_pipeline(model: str = "sdxl", weights: str = "auto", device: str | None = None,
                  dtype: str | torch.dtype = "fp32", path: str | None = None, seed: int = 0,
                  verbose: bool = True, vae: str | None = None, scheduler: str | None = None):
    """Load one of the course's pipelines (see fdh.MODELS). Introduced in 00_setup.ipynb.

    weights: "pretrained" (hub id, or `path`, safetensors only), "random" (full-size
    architecture, seeded random weights, built on the meta device and initialised on
    `device`; device="meta" allocates nothing), "tiny" (small configs for CPUs) or "auto"
    (pretrained if available, else random on a GPU, else tiny; prints its choice).
    vae: None (the pipeline's own) or "fp16-fix" (madebyollin/sdxl-vae-fp16-fix: its weights
    when pretrained, its config otherwise), the VAE diffusion-fast used for SDXL and SSD-1B.
    scheduler: None (the pipeline's own) or "dpm-solver" (DPMSolverMultistepScheduler from the
    pipeline's scheduler config, as diffusion-fast ran SD1.5).
    Every component is returned in eval mode."""
    spec = get_spec(model)
    torch_dtype = resolve_dtype(dtype)
    _check_swaps(vae, scheduler)
    device = device or default_device()
    if device == "meta" and weights != "random":
        raise FastdiffError("device='meta' builds the architecture only: use weights='random'.")
    weights = resolve_weights(spec, weights, device, path, verbose)
    if weights == "pretrained":
        pipe = _load_pretrained(spec, path, torch_dtype)
        if device != "cpu":
            pipe.to(device)
    else:
        pipe = _build_pipeline(spec, "full" if weights == "random" else "tiny", device,
                               torch_dtype, seed)
    vae_source = "pipeline"
    if vae is not None:
        vae_source = _swap_vae(pipe, vae, weights, device, torch_dtype, seed)
    if scheduler is not None:
        import diffusers

        pipe.scheduler = getattr(diffusers, SCHEDULERS[scheduler]).from_config(
            pipe.scheduler.config)
    for comp in pipe.components.values():
        if isinstance(comp, torch.nn.Module):
            comp.eval()
    pipe.set_progress_bar_config(disable=True)
    pipe._fastdiff = {"model": spec.key, "weights": weights, "dtype": str(torch_dtype),
                      "device": device, "vae": vae_source, "applied": {}}
    return pipe


def resolve_weights(model: str | ModelSpec, weights: str, device: str,
                    path: str | None = None, verbose: bool = True) -> str:
    """`weights` itself, or for "auto" the source choose_weights picks, printing why."""
    if weights not in WEIGHTS:
        raise FastdiffError(f"Unknown weights {weights!r}. Use one of {', '.join(WEIGHTS)}.")
    if weights != "auto":
        return weights
    spec = get_spec(model)
    weights, why = choose_weights(spec, path, device)
    if verbose:
        print(f"fastdiff: weights='{weights}' for {spec.key} ({why})")
    return weights


def choose_weights(spec: ModelSpec, path: str | None, device: str) -> tuple[str, str]:
    ok, why = pretrained_status(spec, path)
    if ok:
        return "pretrained", why
    if device.startswith("cuda"):
        return "random", f"{why}; on a GPU the full-size architecture with random weights"
    return "tiny", f"{why}; no GPU, so the tiny model"


def count_parameters(pipe) -> dict[str, int]:
    """Parameters per component, plus "total". Introduced in 01_baseline.ipynb."""
    counts = {}
    for name, comp in pipe.components.items():
        if isinstance(comp, torch.nn.Module):
            counts[name] = sum(p.numel() for p in comp.parameters())
    counts["total"] = sum(counts.values())
    return counts


def pipeline_info(pipe) -> dict[str, Any]:
    """What load_pipeline recorded: model, weights, dtype, device, applied techniques."""
    info = getattr(pipe, "_fastdiff", None)
    if info is None:
        raise FastdiffError("This pipeline was not loaded with fdh.load_pipeline(); load it "
                            "with fdh.load_pipeline(model, weights=...) first.")
    return info


def call_kwargs(pipe, prompt: str = "a photo of an astronaut riding a horse on mars",
                steps: int | None = None, height: int | None = None, width: int | None = None,
                guidance: float | None = None, seed: int = 0) -> dict[str, Any]:
    """The keyword arguments the helpers pass to `pipe(...)`: the model's defaults (native or
    tiny resolution, steps, guidance) unless given, a seeded CPU generator, and per-model
    switches (PixArt: no resolution binning, no caption cleaning)."""
    info = pipeline_info(pipe)
    spec = get_spec(info["model"])
    size = spec.tiny_resolution if info["weights"] == "tiny" else spec.resolution
    kwargs: dict[str, Any] = dict(
        prompt=prompt, num_inference_steps=steps or spec.steps, height=height or size,
        width=width or size, guidance_scale=spec.guidance if guidance is None else guidance,
        generator=torch.Generator("cpu").manual_seed(seed), output_type="pil")
    kwargs.update(spec.call_kwargs)
    return kwargs


def generate(pipe, prompt: str = "a photo of an astronaut riding a horse on mars",
             steps: int | None = None, height: int | None = None, width: int | None = None,
             guidance: float | None = None, seed: int = 0):
    """One image, with the same arguments fdh.benchmark uses. Introduced in 00_setup.ipynb."""
    # no inference_mode here: the pipeline runs under its own no_grad, as in benchmark(), so
    # a compiled pipeline sees the same grad mode (else a dynamo guard fails: recompile)
    return pipe(**call_kwargs(pipe, prompt, steps, height, width, guidance, seed)).images[0]


def get_denoiser(pipe) -> torch.nn.Module:
    """The denoising network: pipe.unet (SD family) or pipe.transformer (PixArt)."""
    return pipe.unet if hasattr(pipe, "unet") else pipe.transformer


def pipeline_device(pipe) -> torch.device:
    return next(get_denoiser(pipe).parameters()).device
