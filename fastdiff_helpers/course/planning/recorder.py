"""The course clock's recorder: with FASTDIFF_CLOCK_LOG set, what a process does that takes GPU
time (each pipeline load and call, each compile, each benchmark) is appended to that file as
JSON lines. The notebook smoke runs set it (tests/test_notebooks.py), course settings turn the
recorder on (start_recording: it listens to the core's events, models/hooks.py, and watches the
pipeline classes' calls and dynamo's frames), and course/planning/clock.py turns the record into
what each notebook would do on a GPU. Off (no variable), nothing is recorded.

Introduced with the course clock (docs/workshop.md: "The course clock").
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any, Iterator

from ...models.dtypes import fp32_or_half
from .gpus import PROFILES
from ...models.hooks import listening
from ...models.loading import pipeline_info
from ...models.state import PipelineState, compiled_by_hand
from .autotune import tunes
from .clock_gpu import recipe_id

ENV = "FASTDIFF_CLOCK_LOG"


def recording_asked() -> bool:
    return bool(os.environ.get(ENV))


def record(event: dict[str, Any]) -> None:
    """Append one event to the clock's log (nothing when FASTDIFF_CLOCK_LOG is unset)."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event, sort_keys=True, default=str) + "\n")


def kind(info: PipelineState | None, pipe: Any = None) -> str:
    """What a pipeline's calls cost on a GPU, in the clock's three kinds: "compiled", else
    "fp32" (TF32 included) or "half" (bf16, fp16), from the helpers' record of it, or, given
    `pipe`, read off its denoiser: compiled by hand (a plain `torch.compile` cell), or cast by
    hand (a plain `pipe.to(torch.bfloat16)` cell: its weights' dtype, not the load's). `info`
    None: a pipeline the helpers have no record of."""
    if info is not None and "compile" in info.applied:
        return "compiled"
    denoiser = None
    if pipe is not None:
        # `is None`, not `or`: a module wrapped by torch.compile (`pipe.unet =
        # torch.compile(pipe.unet)`, as the blog wrote it) has no truth value
        denoiser = getattr(pipe, "unet", None)
        denoiser = getattr(pipe, "transformer", None) if denoiser is None else denoiser
    if denoiser is not None and compiled_by_hand(denoiser) is not None:
        return "compiled"
    recipe = info.recipe if info is not None else None
    dtype = getattr(recipe, "dtype", None) or (
        str(next(denoiser.parameters()).dtype) if denoiser is not None
        else info.dtype if info is not None else "")
    return fp32_or_half(dtype)


def _frame(args) -> None:
    from torch._dynamo.callback import CallbackTrigger

    if args.callback_trigger == CallbackTrigger.DYNAMO:
        record({"event": "frame"})


def watch_compiles() -> None:
    """Record every frame dynamo compiles (a graph for inductor; a recompile is one more) while
    recording, through any dynamo reset. Dynamo runs its start callbacks once per frame it
    compiles (torch/_dynamo/convert_frame.py, callback_handler.install_callbacks), and
    torch._dynamo.reset() clears every callback (torch/_dynamo/__init__.py reset:
    callback_handler.clear(); fdh.free_memory calls it): so the handler's clear is wrapped once
    to register ours again after it."""
    from torch._dynamo.callback import callback_handler

    if _frame not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_frame)
    if getattr(callback_handler.clear, "_fastdiff_clock", False):
        return
    clear = callback_handler.clear

    def clear_and_keep_ours() -> None:
        try:
            clear()
        finally:
            if _frame not in callback_handler.start_callbacks:
                callback_handler.register_start_callback(_frame)

    clear_and_keep_ours._fastdiff_clock = True
    callback_handler.clear = clear_and_keep_ours


def watch_calls(pipe: Any) -> None:
    """Record every call of this pipeline's class (model, weight dtype, whether compiled). A
    pipeline class's __call__ is wrapped once, and only while recording (a test run)."""
    cls = type(pipe)
    if getattr(cls.__call__, "_fastdiff_clock", False):
        return
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        info = getattr(self, "_fastdiff", None)
        record({"event": "call", "model": info.model if info else None,
                "kind": kind(info, self)})
        return original(self, *args, **kwargs)

    __call__._fastdiff_clock = True
    cls.__call__ = __call__


def _listen(event: str, facts: dict[str, Any]) -> None:
    """The core's events (models/hooks.py) as the clock's."""
    info = pipeline_info(facts["pipe"])
    if event == "load":
        record({"event": "load", "model": info.model})
        watch_calls(facts["pipe"])
        watch_compiles()
    elif event == "compile":
        # as the course clock's card (an H100) runs fdh.apply's recipe, whatever this machine
        # is; a compile outside fdh.apply, as a GPU runs its mode
        asked = facts["recipe"]
        on_gpu = (asked.for_device("cuda", PROFILES["h100"].capability)[0]
                  if asked is not None else None)
        mode = on_gpu.compile if on_gpu is not None else facts["gpu_mode"]
        flags = on_gpu.inductor_flags if on_gpu is not None else facts["inductor_flags"]
        record({"event": "compile", "model": info.model, "mode": mode,
                "scope": facts["scope"], "vae": facts["compile_vae"], "tunes": tunes(mode, flags),
                "recipe": recipe_id(on_gpu.to_dict() if on_gpu is not None else None)})
    elif event in ("trace", "trace_end"):  # a trace, not a compile: the clock skips its frames
        record({"event": {"trace": "explain", "trace_end": "explain_end"}[event]})
    elif event == "benchmark":
        record({"event": "benchmark", "model": info.model, "kind": kind(info, facts["pipe"]),
                "profile": facts["profile"]})
    elif event == "benchmark_end":
        record({"event": "benchmark_end"})


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record what the helpers do inside the block (while FASTDIFF_CLOCK_LOG is set)."""
    with listening(_listen):
        yield


_ON: list = []


def start_recording() -> bool:
    """Turn the recorder on for the rest of this process where FASTDIFF_CLOCK_LOG is set (course
    settings, the first cell of every notebook, call it); once. Returns whether it is on."""
    if recording_asked() and not _ON:
        _ON.append(recording())
        _ON[0].__enter__()
    return bool(_ON)
