"""The kinds of work fdh.profile sorts a pipeline's time into, by op and kernel name.

Introduced in 16_where_the_time_goes.ipynb (through fdh.profile). Imports nothing of the
package."""

from __future__ import annotations

HOST = "host-side gaps and syncs"
STAGE_PREFIX = "fastdiff: "  # the stage ranges fdh.profile adds to the trace (not work)
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


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def kinds_from_events(events, cuda: bool, wall_us: float) -> tuple[dict[str, float],
                                                                     dict[str, list], int]:
    """Seconds per kind (HOST included) and the top ops of each kind, from the profiler's
    events; and the number of device-to-host syncs (CUDA runtime calls that wait)."""
    from torch.autograd import DeviceType

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
        ranges = [e for e in events if e.name.startswith(STAGE_PREFIX)]
        thread = ranges[0].thread if ranges else None
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
            parent = e.cpu_parent
            if parent is None or parent.name.startswith(STAGE_PREFIX):
                busy.append((e.time_range.start, e.time_range.end))
    # the rest of the wall time: no op (CPU) or no kernel (GPU) was running
    covered = _union(busy)
    add(HOST, "no op running" if not cuda else "device idle", max(wall_us - covered, 0.0))
    seconds = {k: v / 1e6 for k, v in kinds.items()}
    top = {k: sorted(((n, us / 1e6) for n, us in ops.items()), key=lambda t: -t[1])[:5]
           for k, ops in per_op.items() if ops}
    return seconds, top, syncs
