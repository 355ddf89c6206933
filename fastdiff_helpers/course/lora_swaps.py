"""14's LoRA lesson: the stand-in LoRA files it makes in code (make_lora_file: peft's layers on a
meta-device copy, saved by diffusers' own save_lora_weights), and what switching LoRAs costs a
compiled pipeline: dynamo recompiles, CUDA-graph recordings and seconds, LoRA by LoRA, with
diffusers' hot-swap or without it: the first call after each switch (what the switch costs),
then steady calls timed as fdh.benchmark times them.

Introduced in 14_lora_hotswap.ipynb."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..checks import arg, whole
from ..errors import FastdiffError
from ..models.loading import call_kwargs, get_denoiser, pipeline_device
from ..techniques.lora import LORA_FILE, check_loadable, load_lora, loaded_lora, lora_file_info
from ..measure.bench import time_call
from ..measure.compile_events import events_between, recompile_reasons, snapshot
from ..measure.record import median_interval
from ..measure.timing import steady_note, uncertainty, until_steady
from .planning.writes import output_folder, same_bytes

__all__ = ["make_lora_file", "lora_swap_report", "count_cuda_graph_recordings",
           "DEFAULT_LORA_TARGETS", "TEXT_ENCODER_TARGETS"]

# the attention projections every LoRA trainer of diffusers targets (train_text_to_image_lora)
DEFAULT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
TEXT_ENCODER_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")


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

    check_loadable(pipe)
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
                     seed: int = 0, runs: int = 5, warmup: int = 1, max_runs: int | None = None,
                     verbose: bool = True) -> dict[str, Any]:
    """Call the pipeline with the LoRA it has loaded (the first call of a compiled pipeline is
    its compile), then switch to each of `loras` in turn (each a folder, a file, a hub id or a
    (hub id, weight_name) pair, as fdh.load_lora takes) and call again: with `hotswap=True` by
    diffusers' hot-swap (the weights copied in place), else by unloading the
    LoRA and loading the next one (what a user without hot-swap does). Every file is checked
    before the first call.

    For each LoRA: the first call after the switch, timed alone (`first_call_s`: what the
    switch costs the next image, a compile included), `warmup` untimed calls, then `runs` timed
    calls and more, up to `max_runs` (default 4 x runs), until their median is known within
    +-5 % (timing.until_steady, as fdh.benchmark): `seconds` (the median), `uncertainty` (its
    +- as a share), `samples`, and `timing`, the median as text with its +-. Every call
    synchronises on a GPU (measure/bench.py time_call).

    Returns {"rows": [...], "recompiled": bool, "cuda_graphs_rerecorded": bool}: one row per
    LoRA with how it got there, dynamo's frames compiled and compile seconds and the CUDA graphs
    recorded (0 on a CPU) in its first call, what the calls after it compiled or recorded
    (0 when steady), the timings above, notes, the recompile reasons new since the LoRA before,
    and the first call's image (float in [0, 1] as "image", 8-bit as "pil", as a pipeline
    returns it). Introduced in 14_lora_hotswap.ipynb."""
    first = loaded_lora(pipe)  # read against the pipeline's LoRA layers
    if first is None:
        raise FastdiffError("No LoRA loaded: load the first one with fdh.load_lora(pipe, folder)"
                            " (after fdh.enable_lora_hotswap for hot-swaps), compile, then "
                            "report.")
    if isinstance(loras, (str, Path)) or not loras:
        raise FastdiffError(f"{arg('loras', loras)} cannot work: give a list of LoRAs to "
                            "switch to, e.g. [lora_b, lora_a].")
    whole("runs", runs, 1)
    whole("warmup", warmup, 0)
    max_runs = whole("max_runs", max_runs, 1, none=True) or 4 * runs
    if max_runs < runs:
        raise FastdiffError(f"{arg('max_runs', max_runs)} is below {arg('runs', runs)}: give "
                            "max_runs >= runs (or leave it out: 4 x runs).")
    files = [lora_file_info(lora)["path"] for lora in loras]  # each one readable, before a call
    plan = [(first["path"], "loaded first", None)]
    plan += [(f, "hot-swap" if hotswap else "unload + load", f) for f in files]
    device = pipeline_device(pipe)
    rows = []
    for name, how, folder in plan:
        if folder is not None:
            if not hotswap:
                pipe.unload_lora_weights()
            load_lora(pipe, folder, hotswap=hotswap)
        seen = {k: len(v) for k, v in recompile_reasons().items()}
        before = snapshot()
        with count_cuda_graph_recordings() as graphs:
            image, first = time_call(lambda: _call(pipe, steps, seed), device)
            after_first, first_graphs = snapshot(), graphs[0]
            first_events = events_between(before, after_first)
            for _ in range(warmup):
                _call(pipe, steps, seed)
            samples = until_steady(lambda: time_call(lambda: _call(pipe, steps, seed),
                                                     device)[1], runs, max_runs)
        later = events_between(after_first, snapshot())
        reasons = [r for k, v in recompile_reasons().items() for r in v[seen.get(k, 0):]]
        notes = [n for n in [steady_note(samples, runs, max_runs)] if n]
        if later["frames"] or graphs[0] - first_graphs:
            notes.append(f"the calls after the first compiled {later['frames']} frame(s) and "
                         f"recorded {graphs[0] - first_graphs} CUDA graph(s): the timed ones "
                         "may include that work")
        rows.append({"lora": Path(name).parent.name if Path(name).name == LORA_FILE
                     else Path(name).name,
                     "how": how, "frames_compiled": first_events["frames"],
                     "compile_s": first_events["compile_s"], "cuda_graphs_recorded": first_graphs,
                     "later_frames_compiled": later["frames"],
                     "later_cuda_graphs_recorded": graphs[0] - first_graphs,
                     "first_call_s": first, "seconds": statistics.median(samples),
                     "uncertainty": uncertainty(samples), "samples": samples,
                     "timing": _timing(samples), "notes": notes,
                     "reasons": reasons, "image": image,
                     "pil": pipe.numpy_to_pil(image[None])[0]})
        if verbose:
            print(_line(rows[-1]))
    later = rows[1:]
    report = {"rows": rows, "recompiled": any(r["frames_compiled"] for r in later),
              "cuda_graphs_rerecorded": any(r["cuda_graphs_recorded"] for r in later)}
    if verbose:
        print("switching LoRAs " + ("recompiled" if report["recompiled"] else
                                    "compiled nothing") +
              (" and re-recorded CUDA graphs" if report["cuda_graphs_rerecorded"] else ""))
    return report


def _timing(samples: list[float]) -> str:
    """'0.066 s +-3% (median of 5)', the interval's coverage said where below 90 %."""
    median, u = statistics.median(samples), uncertainty(samples)
    if u is None:
        return f"{median:.3f} s (one run: no +-)"
    coverage = median_interval(samples)[2]
    sure = "" if coverage >= 0.9 else f", an interval of {coverage:.0%} only"
    return f"{median:.3f} s +-{u:.0%} (median of {len(samples)}{sure})"


def _line(row: dict[str, Any]) -> str:
    return (f"{row['lora']:>16} {'(' + row['how'] + ')':15} compiled {row['frames_compiled']} frame(s) in "
            f"{row['compile_s']:.1f} s, {row['cuda_graphs_recorded']} CUDA graph(s) recorded; "
            f"first call {row['first_call_s']:.2f} s (one call), then {row['timing']}"
            + "".join(f"\n    - {r}" for r in row["reasons"][:2])
            + "".join(f"\n    note: {n}" for n in row["notes"]))
