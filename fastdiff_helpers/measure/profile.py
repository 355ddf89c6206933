"""profile(): where one image's time goes, per stage and per kind of work, from torch.profiler.

Introduced in 16_where_the_time_goes.ipynb. (fdh.profile_chart, in results/, draws it.)

The kinds of work are the profiler's ops (on a CPU: each op's self time on the calling thread)
or kernels (on a GPU: device time), sorted by name into matmul, convolution, attention,
normalisation, elementwise, casts and copies, kernels inductor fused, and other ops; what is
left of the wall time is host-side time: Python, dispatch and the guards of compiled code
between ops on a CPU, and on a GPU the time the device sat idle (launch gaps, syncs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

from .. import checks
from ..errors import FastdiffError
from ..models.loading import call_kwargs, pipeline_device
from ..models.presets import DEFAULT_PROMPT
from .timing import STAGE_PREFIX, StageMarks, marked, profiling, synchronize

__all__ = ["profile", "Profile", "KINDS", "kind_of"]

# --- The kinds of work, by op and kernel name ----------------------------------------------------

HOST = "host-side gaps and syncs"
KINDS = ("matmul", "convolution", "attention", "normalisation", "elementwise",
         "casts and copies", "fused by inductor", "other ops", HOST)

# What each kind is called: torch's op names (CPU; exact, an in-place "_" variant included) and
# words in kernel names (GPU, and inductor's generated code). The first kind that matches wins.
# Classic attention's softmax counts as attention (its two batched matmuls as matmul).
_OPS = {
    "attention": {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_flash_attention_forward", "_efficient_attention_forward", "softmax",
                  "_softmax", "_safe_softmax"},
    "convolution": {"conv2d", "convolution", "_convolution", "mkldnn_convolution",
                    "_slow_conv2d_forward", "cudnn_convolution", "_nnpack_spatial_convolution",
                    "convolution_overrideable", "conv_depthwise2d"},
    "normalisation": {"group_norm", "native_group_norm", "layer_norm", "native_layer_norm",
                      "batch_norm", "native_batch_norm", "rms_norm", "_fused_rms_norm"},
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_int_mm", "_scaled_mm",
               "mkldnn_linear", "_weight_int8pack_mm", "einsum", "_addmm_activation"},
    "casts and copies": {"to", "_to_copy", "copy", "contiguous", "clone", "cat", "empty",
                         "empty_strided", "empty_like", "zeros", "zeros_like", "ones",
                         "ones_like", "fill", "full", "stack", "lift_fresh", "detach_",
                         "resolve_conj", "resolve_neg"},
    "elementwise": {"add", "sub", "rsub", "mul", "div", "silu", "gelu", "sigmoid", "exp", "sin",
                    "cos", "pow", "sqrt", "rsqrt", "neg", "tanh", "clamp", "where", "erf", "abs",
                    "upsample_nearest2d", "mean", "sum", "max", "min", "amax", "round", "lerp",
                    "addcmul", "addcdiv", "reciprocal", "log", "maximum", "minimum", "eq", "ne",
                    "gt", "lt", "ge", "le", "relu", "square", "var", "std", "cumsum", "floor",
                    "masked_fill", "logical_not", "bitwise_not"},
}
_KERNEL_WORDS = (
    ("attention", ("flash", "fmha", "attention", "softmax", "sdpa")),
    ("convolution", ("conv", "implicit_gemm", "winograd", "dgrad", "wgrad")),
    ("normalisation", ("group_norm", "layer_norm", "groupnorm", "layernorm", "batch_norm",
                       "rms_norm")),
    ("matmul", ("gemm", "cutlass", "xmma", "ampere_", "hopper_", "nvjet", "cublas",
                "triton_tem_fused_mm", "triton_tem_fused_addmm", "triton_tem_fused_bmm",
                "_scaled_mm", "int_mm")),
    ("casts and copies", ("memcpy", "memset", "copy", "cat_", "catarray", "fill")),
    ("fused by inductor", ("triton_poi", "triton_red", "triton_per", "cpp_fused",
                           "compiledfxgraph")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce_kernel", "upsample")),
)
# host-side work the profiler records as ranges of its own (dynamo's guards and dispatch)
HOST_RANGES = ("torch-compiled region", "torchdynamo cache lookup", "cudagraph")


def kind_of(name: str) -> str:
    """The kind of work an op or kernel name is (one of KINDS but HOST)."""
    low = name.lower()
    if low.startswith("aten::"):
        op = low[len("aten::"):].rstrip("_")
        return next((kind for kind, ops in _OPS.items() if op in ops), "other ops")
    # inductor's generated kernels name what they fused: a fused norm is normalisation work
    if low.startswith(("triton_", "cpp_fused")) and "norm" in low and "tem_" not in low:
        return "normalisation"
    for kind, words in _KERNEL_WORDS:
        if any(word in low for word in words):
            return kind
    return "other ops"


def kinds_from_events(events, cuda: bool, wall_us: float) -> tuple[dict[str, float],
                                                                     dict[str, list], int]:
    """Seconds per kind (HOST included) and the top ops of each kind, from the profiler's
    events; and the number of device-to-host syncs (CUDA runtime calls that wait)."""
    kinds = {k: 0.0 for k in KINDS}
    per_op: dict[str, dict[str, float]] = {k: {} for k in KINDS}
    # the host waiting for the device (cudaStreamSynchronize, cudaEventSynchronize...) inside the
    # stages, not the measurement's own waits before and after them
    stages = [e for e in events if e.name.startswith(STAGE_PREFIX)]
    first = min((e.time_range.start for e in stages), default=float("-inf"))
    last = max((e.time_range.end for e in stages), default=float("inf"))
    syncs = sum(1 for e in events if e.device_type == DeviceType.CPU
                and "Synchronize" in e.name and first <= e.time_range.start <= last)

    def add(kind: str, name: str, us: float) -> None:
        kinds[kind] += us
        per_op[kind][name] = per_op[kind].get(name, 0.0) + us

    busy: list[tuple[float, float]] = []
    if cuda:
        for e in events:
            # ranges (ours, inductor's) mirrored on the device are annotations, not work: torch
            # leaves them out of device time too (autograd/profiler_util.py, _build_table)
            if (e.device_type == DeviceType.CPU or getattr(e, "is_user_annotation", False)
                    or e.name.startswith((STAGE_PREFIX, "## Call CompiledFxGraph"))):
                continue
            us = e.time_range.end - e.time_range.start
            if us <= 0:
                continue
            add(kind_of(e.name), e.name, us)
            busy.append((e.time_range.start, e.time_range.end))
    else:
        thread = stages[0].thread if stages else None
        for e in events:
            if e.device_type != DeviceType.CPU or e.thread != thread or e.is_async:
                continue
            if e.name.startswith(STAGE_PREFIX) or e.time_range.end <= e.time_range.start:
                continue
            us = e.self_cpu_time_total
            low = e.name.lower()
            kind = (HOST if low.startswith(HOST_RANGES) and "compiledfxgraph" not in low
                    else kind_of(e.name))
            if us > 0:
                add(kind, e.name, us)
            if e.cpu_parent is None or e.cpu_parent.name.startswith(STAGE_PREFIX):
                busy.append((e.time_range.start, e.time_range.end))
    # the rest of the wall time: no op (CPU) or no kernel (GPU) was running (the busy union)
    covered, end = 0.0, float("-inf")
    for a, b in sorted(busy):
        if b > end:
            covered += b - max(a, end)
            end = b
    add(HOST, "no op running" if not cuda else "device idle", max(wall_us - covered, 0.0))
    seconds = {k: v / 1e6 for k, v in kinds.items()}
    top = {k: sorted(((n, us / 1e6) for n, us in ops.items()), key=lambda t: -t[1])[:5]
           for k, ops in per_op.items() if ops}
    return seconds, top, syncs


# --- profile(): where one image's time goes ------------------------------------------------------

@dataclass
class Profile:
    """Where one image's time went. Seconds throughout. `stages` in call order (the text
    encoders, each iteration of the denoising loop, "step N", ended by the scheduler's step,
    which is one per timestep: PNDM (SD1.5) has steps + 1; the last step ends where the VAE
    decode starts, so the steps add up to denoising_s; the VAE decode; then what is outside
    them, "other"): the median of each over the timed calls, as wall_s is theirs; `kinds` in
    KINDS order, adding up to profiled_wall_s (the call under the profiler); `denoising_s` spans
    the first step's start to the VAE decode's start, as fdh.benchmark's "denoising" stage does."""

    device: str
    wall_s: float
    stages: dict[str, float]
    kinds: dict[str, float]
    profiled_wall_s: float = 0.0
    denoising_s: float | None = None
    top_ops: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    syncs: int = 0
    trace_path: str | None = None
    notes: list[str] = field(default_factory=list)

    def stage_groups(self) -> dict[str, float]:
        """The stages grouped as fdh.benchmark names them: text_encoding, denoising (every
        step), vae_decode, other."""
        groups = {"text_encoding": 0.0, "denoising": 0.0, "vae_decode": 0.0, "other": 0.0}
        for name, seconds in self.stages.items():
            key = ("text_encoding" if name == "text encoders" else
                   "vae_decode" if name == "VAE decode" else
                   "denoising" if name.startswith("step ") else "other")
            groups[key] += seconds
        return groups

    def table(self) -> str:
        """Two small tables as text: time per stage (steps folded after the first three) and
        per kind of work, each with its share of the wall time."""
        def share(s: float, whole: float) -> str:
            return f"{s * 1e3:9.2f} ms {s / whole:6.1%}" if whole else f"{s * 1e3:9.2f} ms"

        lines = [f"one image on {self.device}: {self.wall_s * 1e3:.2f} ms "
                 f"({self.profiled_wall_s * 1e3:.2f} ms under the profiler)", "",
                 "stage (share of the image)"]
        steps = [k for k in self.stages if k.startswith("step ")]
        for name, seconds in self.stages.items():
            if name in steps[3:-1]:
                continue
            lines.append(f"  {name:<26}{share(seconds, self.wall_s)}")
            if len(steps) > 4 and name == steps[2]:
                folded = sum(self.stages[k] for k in steps[3:-1])
                lines.append(f"  {f'... {len(steps) - 4} more steps':<26}"
                             f"{share(folded, self.wall_s)}")
        lines += ["", "kind of work (share of the profiled call)"]
        for kind, seconds in sorted(self.kinds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {kind:<26}{share(seconds, self.profiled_wall_s)}")
        if self.syncs:
            lines.append(f"  ({self.syncs} device-to-host syncs in the call)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _marked_call(pipe, call, device: torch.device) -> tuple[StageMarks, Any, Any]:
    """One call with its stage marks; read them with _read_marks (after a profiler stops, so
    its waits on the CUDA events are not in the trace)."""
    marks = StageMarks(device, steps=True, ranges=True)
    with marked(pipe, marks):  # no inference_mode: the pipeline's own no_grad, as benchmark
        synchronize(device)
        start = marks.now()
        call()
        marks.close()  # a last step still open (output_type="latent": no decode closed it)
        end = marks.now()
    return marks, start, end


def _read_marks(marks: StageMarks, start: Any, end: Any) -> tuple[float, dict[str, float],
                                                                   float | None]:
    """(wall seconds, seconds per stage, denoising seconds) of one marked call."""
    wall = marks.seconds(start, end)
    stages = {name: marks.seconds(a, b) for name, a, b, _ in marks.spans if b is not None}
    stages["other"] = max(wall - sum(stages.values()), 0.0)
    return wall, stages, marks.denoising()


def profile(pipe, prompt: str = DEFAULT_PROMPT, steps: int | None = None,
            height: int | None = None, width: int | None = None,
            guidance: float | None = None, seed: int = 0, warmup: int = 1, runs: int = 3,
            trace: str | Path | None = None) -> Profile:
    """Say where one image's time goes: per stage (text encoders, each denoiser step, VAE
    decode) and per kind of work (KINDS), as a Profile (print it for the tables;
    fdh.profile_chart(p) for the chart).

    `warmup` untimed calls first (a compiled pipeline is profiled warm); then `runs` calls
    timed with stage marks and no profiler (the stage times: per stage, the median over the
    runs, as fdh.benchmark times them); then one call under torch.profiler (the kinds of work,
    adding up to its own wall time, profiled_wall_s: the profiler's own cost per op makes that
    call slower, said in notes). `trace`: a .json path to save that call's trace for Perfetto
    (ui.perfetto.dev) or chrome://tracing; the stages are named ranges in it.
    Introduced in 16_where_the_time_goes.ipynb."""
    checks.whole("warmup", warmup, 0)
    checks.whole("runs", runs, 1)
    if trace is not None:
        trace = Path(trace)
        if trace.suffix != ".json":
            raise FastdiffError(f"trace={str(trace)!r}: give a .json path (the Chrome "
                                "trace format Perfetto and chrome://tracing open).")
        checks.output_file("trace", trace, "trace.json", lambda p: checks.file_starts(
            p, b"{", b'"schemaVersion"'), "a Chrome trace that torch.profiler wrote")
    device = pipeline_device(pipe)
    cuda = device.type == "cuda"
    call_kwargs(pipe, prompt, steps, height, width, guidance, seed)  # every argument checked

    def call():
        return pipe(**call_kwargs(pipe, prompt, steps, height, width, guidance, seed))

    for _ in range(warmup):
        call()
    timed = [_read_marks(*_marked_call(pipe, call, device)) for _ in range(runs)]
    wall = statistics.median(t[0] for t in timed)
    stages = {name: statistics.median(t[1].get(name, 0.0) for t in timed) for name in timed[0][1]}
    denoising = (statistics.median(t[2] for t in timed)
                 if all(t[2] is not None for t in timed) else None)

    with profiling(cuda) as prof:
        marked = _marked_call(pipe, call, device)
    profiled_wall = _read_marks(*marked)[0]
    kinds, top, syncs = kinds_from_events(prof.events(), cuda, profiled_wall * 1e6)
    notes = [f"stage times: median of {runs} call(s) without the profiler; kinds of work: one "
             f"call under torch.profiler, {profiled_wall * 1e3:.1f} ms against "
             f"{wall * 1e3:.1f} ms without it (the profiler adds a cost per op; calls also vary)"]
    notes.append("CPU: kinds are each op's own (self) time on the calling thread; "
                 f"'{HOST}' is the time no op ran (Python, dispatch, guards)" if not cuda else
                 f"CUDA: kinds are kernel time on the device; '{HOST}' is the time the "
                 "device sat idle during the call (launch gaps, syncs)")
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    return Profile(device=str(device), wall_s=wall, stages=stages, kinds=kinds,
                   profiled_wall_s=profiled_wall, denoising_s=denoising, top_ops=top,
                   syncs=syncs, trace_path=None if trace is None else str(trace), notes=notes)
