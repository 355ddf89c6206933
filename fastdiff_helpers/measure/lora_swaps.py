"""What switching LoRAs costs a compiled pipeline: dynamo recompiles, CUDA-graph recordings and
seconds, call by call, with diffusers' hot-swap or without it.

Introduced in 08_lora_hotswap.ipynb."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..errors import FastdiffError
from ..checks import arg
from ..models.loading import call_kwargs
from ..techniques._state import applied
from ..techniques.lora import LORA_FILE, load_lora, lora_file_info, unload_lora
from .compile_events import events_between, recompile_reasons, snapshot

__all__ = ["lora_swap_report", "count_cuda_graph_recordings"]


@contextlib.contextmanager
def count_cuda_graph_recordings() -> Iterator[list[int]]:
    """Counts the CUDA graphs inductor records inside the block (a first recording and every
    re-recording, e.g. when a parameter's address changed): each is a call of
    CUDAGraphTreeManager.record_function (torch/_inductor/cudagraph_trees.py). Yields a
    one-item list holding the count. Nothing is recorded on a CPU (no CUDA graphs there)."""
    from torch._inductor import cudagraph_trees

    count = [0]
    original = cudagraph_trees.CUDAGraphTreeManager.record_function

    def counted(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    cudagraph_trees.CUDAGraphTreeManager.record_function = counted
    try:
        yield count
    finally:
        cudagraph_trees.CUDAGraphTreeManager.record_function = original


def _call(pipe, steps: int, seed: int) -> np.ndarray:
    kwargs = call_kwargs(pipe, steps=steps, seed=seed)
    kwargs["output_type"] = "np"
    return pipe(**kwargs).images[0]


def lora_swap_report(pipe, loras: Sequence[Any], hotswap: bool = True, steps: int = 2,
                     seed: int = 0, verbose: bool = True) -> dict[str, Any]:
    """Call the pipeline with the LoRA it has loaded (the first call of a compiled pipeline is
    its compile), then switch to each of `loras` in turn (each a folder, a file, a hub id or a
    (hub id, weight_name) pair: fdh.resolve_lora) and call again: with `hotswap=True` by
    diffusers' hot-swap (the weights copied in place), else by unloading the
    LoRA and loading the next one (what a user without hot-swap does). Every file is checked
    before the first call.

    Returns {"rows": [...], "recompiled": bool, "cuda_graphs_rerecorded": bool}: one row per
    call with the LoRA, how it got there, dynamo's frames compiled and compile seconds, CUDA
    graphs recorded (0 on a CPU), the call's seconds, the recompile reasons new since the call
    before, and the image (float in [0, 1] as "image", 8-bit as "pil", as a pipeline returns it).
    Introduced in 08_lora_hotswap.ipynb."""
    if "lora" not in applied(pipe):
        raise FastdiffError("No LoRA loaded: load the first one with fdh.load_lora(pipe, folder)"
                            " (after fdh.enable_lora_hotswap for hot-swaps), compile, then "
                            "report.")
    if isinstance(loras, (str, Path)) or not loras:
        raise FastdiffError(f"{arg('loras', loras)} cannot work: give a list of LoRAs to "
                            "switch to, e.g. [lora_b, lora_a].")
    files = [lora_file_info(lora)["path"] for lora in loras]  # each one readable, before a call
    plan = [(applied(pipe)["lora"]["path"], "loaded first", None)]
    plan += [(f, "hot-swap" if hotswap else "unload + load", f) for f in files]
    rows = []
    for name, how, folder in plan:
        if folder is not None:
            if not hotswap:
                unload_lora(pipe)
            load_lora(pipe, folder, hotswap=hotswap)
        seen = {k: len(v) for k, v in recompile_reasons().items()}
        before, start = snapshot(), time.perf_counter()
        with count_cuda_graph_recordings() as graphs:
            image = _call(pipe, steps, seed)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        events = events_between(before, snapshot())
        reasons = [r for k, v in recompile_reasons().items() for r in v[seen.get(k, 0):]]
        rows.append({"lora": Path(name).parent.name if Path(name).name == LORA_FILE
                     else Path(name).name,
                     "how": how, "frames_compiled": events["frames"],
                     "compile_s": events["compile_s"], "cuda_graphs_recorded": graphs[0],
                     "seconds": seconds, "reasons": reasons, "image": image,
                     "pil": pipe.numpy_to_pil(image[None])[0]})
        if verbose:
            row = rows[-1]
            print(f"{row['lora']:>16} ({how:13}) compiled {row['frames_compiled']} frame(s) in "
                  f"{row['compile_s']:.1f} s, {graphs[0]} CUDA graph(s) recorded, call "
                  f"{seconds:.2f} s" + "".join(f"\n    - {r}" for r in reasons[:2]))
    later = rows[1:]
    report = {"rows": rows, "recompiled": any(r["frames_compiled"] for r in later),
              "cuda_graphs_rerecorded": any(r["cuda_graphs_recorded"] for r in later)}
    if verbose:
        print("switching LoRAs " + ("recompiled" if report["recompiled"] else
                                    "compiled nothing") +
              (" and re-recorded CUDA graphs" if report["cuda_graphs_rerecorded"] else ""))
    return report
