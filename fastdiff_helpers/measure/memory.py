"""Memory: weights, a call's peak, what fits a card. Introduced in 11_fitting_your_gpu.ipynb."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from ..errors import FastdiffError
from ..checks import arg, real
from ..models.dtypes import resolve_dtype, weight_name
from ..models.fit import GIB, part_parameters
from ..models.presets import get_spec
from ..techniques.recipe import Recipe
from .bench import time_call

__all__ = ["weight_bytes", "peak_memory", "what_fits", "GIB"]


def _plain(t: torch.Tensor):
    """The plain tensors that hold `t`'s bytes: `t` itself, or, for a wrapper subclass such as
    torchao's quantized weights (whose own storage is no memory: data_ptr raises), the inner
    tensors it flattens to (torch/utils/_python_dispatch.py is_traceable_wrapper_subclass)."""
    if is_traceable_wrapper_subclass(t):
        for name in t.__tensor_flatten__()[0]:
            yield from _plain(getattr(t, name))
    else:
        yield t


def weight_bytes(model, dtype="bf16") -> dict[str, int]:
    """Bytes of parameters per component: for a model name, of its full-size architecture in
    `dtype` (a name, or a Recipe: its weight dtype), built on the meta device (no memory, no
    download); for a pipeline, of what it holds now. Buffers (position ids, a few KB) are not
    counted; a quantized weight counts the tensors that hold it (its 8-bit data and scales).
    Introduced in 11_fitting_your_gpu.ipynb."""
    if isinstance(model, str):
        key = get_spec(model).key  # an unknown name says which ones exist
        if isinstance(dtype, Recipe):  # its weight dtype (TF32 is fp32 weights)
            if dtype.quantize is not None:
                raise FastdiffError(f"quantize={dtype.quantize!r} stores some weights in 8 bits: "
                                    "the architecture alone does not say which. Load the "
                                    "pipeline, fdh.apply the recipe and measure it with "
                                    "fdh.peak_memory.")
            dtype = weight_name(dtype.dtype)
        per = resolve_dtype(dtype).itemsize
        return {name: n * per for name, n in part_parameters(key).items()}
    if not hasattr(model, "components"):
        raise FastdiffError(f"{arg('model', type(model).__name__)} cannot work: give a model "
                            "name (e.g. 'sdxl') or a pipeline.")
    return {name: sum(t.numel() * t.element_size() for p in module.parameters() for t in _plain(p))
            for name, module in model.components.items() if isinstance(module, torch.nn.Module)}


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensors that aten ops create on one device, alive at once: each new storage
    is counted when an op returns it and uncounted when Python frees it (a weakref finalizer
    on the storage, whose Python object torch keeps for the storage's life). Scratch memory
    inside a kernel is not seen: a lower bound of the allocator's view."""

    def __init__(self, device: torch.device, known: set[int]):
        super().__init__()
        self.device, self.known = device, known
        self.live = self.peak = 0

    def _free(self, key: int, size: int) -> None:
        self.live -= size
        self.known.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (p for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)
                  for p in _plain(leaf)):
            if t.device == self.device:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.known:
                    self.known.add(key)
                    size = storage.nbytes()
                    self.live += size
                    weakref.finalize(storage, self._free, key, size)
        self.peak = max(self.peak, self.live)
        return out


def _resident(pipe, device: torch.device) -> tuple[int, set[int]]:
    """Bytes of the pipeline's parameters and buffers on `device` now, and their storages."""
    seen: dict[int, int] = {}
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            for t in (p for w in [*module.parameters(), *module.buffers()] for p in _plain(w)):
                if t.device == device and (storage := t.untyped_storage()).data_ptr():
                    seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()), set(seen)


def peak_memory(pipe, call: Callable[[], Any], device: str | torch.device | None = None
                ) -> dict[str, Any]:
    """Run `call()` once and return the peak memory it reached on the pipeline's device:
    on CUDA, torch.cuda.max_memory_allocated over the call (after reset_peak_memory_stats);
    on a CPU, the pipeline's parameters and buffers held there plus the most bytes of tensors
    the call's ops kept alive at once (a dispatch mode counting storages; eager calls only).
    Returns {"peak_bytes", "resident_bytes", "kind", "seconds", "output"}.
    Introduced in 11_fitting_your_gpu.ipynb."""
    if device is None:  # where it runs: an offloaded pipeline's weights wait on the CPU
        device = getattr(pipe, "_execution_device", None)
        if not isinstance(device, torch.device):
            device = next(p.device for m in pipe.components.values()
                          if isinstance(m, torch.nn.Module) for p in m.parameters())
    device = torch.device(device)
    if device.type == "cuda":
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        output, seconds = time_call(call, device)
        return {"peak_bytes": torch.cuda.max_memory_allocated(device), "resident_bytes": resident,
                "kind": "cuda_max_allocated", "seconds": seconds, "output": output}
    if device.type != "cpu":
        raise FastdiffError(f"Peak memory on {device.type} is not measured here: run on a CUDA "
                            "GPU or the CPU.")
    resident, known = _resident(pipe, device)
    with _LiveBytes(device, known) as tracker:
        output, seconds = time_call(call, device)
    return {"peak_bytes": resident + tracker.peak, "resident_bytes": resident,
            "kind": "cpu_live_tensors", "seconds": seconds, "output": output}


def what_fits(model: str, card_gib: float, dtype="bf16",
              activations_bytes: int | None = None) -> list[dict[str, Any]]:
    """For a model in `dtype` (a name or a Recipe) on a card of `card_gib` GiB: the weights
    each way of running it keeps on the GPU, with the activations you measured
    (`activations_bytes`, e.g. a GPU peak from fdh.peak_memory minus the weights held), and
    whether that fits:

      all on the GPU                 every component
      text encoders freed            the prompts encoded once (embeddings cached), the text
                                     encoders deleted: the denoiser and the VAE
      model CPU offload              one component at a time: the largest one
      group / sequential offload     a block or a layer at a time: far below the largest
                                     component (not computed here; measure it on a GPU)

    Without activations_bytes a row counts the weights alone ("counted": "weights only"), and
    its "fits" is a necessary condition, not a verdict: the activations, the VAE decode's
    peak and the kernels' workspaces come on top. With a measured GPU peak they are in, and
    what stays outside is what torch's allocator does not count: the CUDA context, and
    memory the allocator keeps cached but free.
    Introduced in 11_fitting_your_gpu.ipynb."""
    if real("card_gib", card_gib) <= 0:
        raise FastdiffError(f"{arg('card_gib', card_gib)} cannot work: give the card's memory "
                            "in GiB, e.g. 24.")
    parts = weight_bytes(model, dtype)
    text = sum(v for k, v in parts.items() if k.startswith("text_encoder"))
    ways = [("all on the GPU", sum(parts.values())),
            ("text encoders freed after encoding", sum(parts.values()) - text),
            ("model CPU offload", max(parts.values()))]
    extra = activations_bytes or 0
    counted = "weights only" if activations_bytes is None else "weights + activations given"
    return [{"way": way, "weights_bytes": held, "activations_bytes": activations_bytes,
             "counted": counted, "fits": held + extra <= card_gib * GIB} for way, held in ways]
