"""The GPUs workshops get, as data, for planning the day: memory, SMs, compute capability, and
what each can do for the course (bf16 graphs, flash attention, fp8, max-autotune's GEMM
templates), each decided by the same rule as the library line that decides it on the card
itself (tests/test_gpus.py pins every rule against that line with the card's properties faked);
and whether a model fits a card (fits, from models/fit.py's estimate).

Introduced in 00_setup.ipynb. `fdh.course.gpu_profile()` is this machine's GPU (None without
one), `fdh.course.gpu_profile("t4")` a card you plan for (`python -m fastdiff_helpers plan --gpu
t4`)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ...errors import FastdiffError
from ...models.dtypes import BF16_FROM, FLASH_FROM, FP8_FROM
from ...models.fit import GIB, peak_bytes

GB = 10 ** 9

# Each decision's rule, with the line that decides it on a real card: bf16 graphs, flash
# attention and fp8 matmuls are the core's (models/dtypes.py, where the recipe reads them too);
# - max-autotune's GEMM/conv templates: torch/_inductor/utils.py is_big_gpu, `min_sms = 16 if
#   device.type == "xpu" else 68  # 3080` ("Not enough SMs to use max_autotune_gemm mode");
#   below it max-autotune tunes no matmul. The package's one statement of the rule.
TEMPLATE_SMS = 68


@dataclass(frozen=True)
class GpuProfile:
    """One card. memory_gb: as sold; total_bytes: what the CUDA driver reports as the card's
    memory (torch.cuda.get_device_properties().total_memory), where a source gives it, else the
    as-sold figure in decimal bytes (total_source says which); tflops: dense half-precision
    tensor TFLOPS and fp32_tflops plain FP32 TFLOPS, from the maker's datasheet (no sparsity),
    used only to scale the course clock's H100 image times."""

    key: str
    name: str
    memory_gb: int
    total_bytes: int
    total_source: str
    sms: int
    capability: tuple[int, int]
    tflops: float
    fp32_tflops: float

    @property
    def bf16_graphs(self) -> bool:
        """Inductor compiles bf16 graphs here (else it skips them: the run stays eager)."""
        return self.capability >= BF16_FROM

    @property
    def flash_attention(self) -> bool:
        return self.capability >= FLASH_FROM

    @property
    def fp8(self) -> bool:
        return self.capability >= FP8_FROM

    @property
    def gemm_templates(self) -> bool:
        """max-autotune tunes GEMM/conv templates here (is_big_gpu)."""
        return self.sms >= TEMPLATE_SMS

    @property
    def half(self) -> str:
        """The course's half precision here: bf16 where inductor compiles it, else fp16."""
        return "bf16" if self.bf16_graphs else "fp16"

    @property
    def gib(self) -> float:
        return self.total_bytes / 1024 ** 3

    def can(self) -> dict[str, bool]:
        """What the card supports, by name (the plan's and the notebooks' one list)."""
        return {"bf16 graphs": self.bf16_graphs, "flash attention": self.flash_attention,
                "fp8": self.fp8, "GEMM templates": self.gemm_templates}

    def properties(self) -> SimpleNamespace:
        """The card's torch.cuda device properties, faked (the fields the deciding lines read):
        for tests and for planning on a machine without this card."""
        return SimpleNamespace(name=self.name, major=self.capability[0],
                               minor=self.capability[1], total_memory=self.total_bytes,
                               multi_processor_count=self.sms)


_AS_SOLD = "as sold, in decimal bytes (no driver figure on file)"
_DEVICE_QUERY = "deviceQuery's 'Total amount of global memory'"
PROFILES = {p.key: p for p in [
    # T4: 15843721216 bytes, deviceQuery on a Tesla T4 (chiemon.github.io/2024/12/25, NVIDIA
    # "Tesla T4"; TensorFlow logs the same 14.75 GiB, tensorflow/tensorflow#62170 era logs)
    GpuProfile("t4", "Tesla T4", 16, 15843721216, _DEVICE_QUERY, 40, (7, 5), 65.0, 8.1),
    GpuProfile("l4", "NVIDIA L4", 24, 24 * GB, _AS_SOLD, 58, (8, 9), 121.0, 30.3),
    # A10G: AWS publishes no tensor figure; the A10's datasheet: 125 TFLOPS fp16 dense, 31.2 FP32
    GpuProfile("a10g", "NVIDIA A10G", 24, 24 * GB, _AS_SOLD, 80, (8, 6), 125.0, 31.2),
    # A100 40GB: 42298834944 bytes, deviceQuery (bottlerocket-os/bottlerocket#3873)
    GpuProfile("a100-40", "NVIDIA A100-SXM4-40GB", 40, 42298834944, _DEVICE_QUERY, 108, (8, 0),
               312.0, 19.5),
    GpuProfile("a100-80", "NVIDIA A100-SXM4-80GB", 80, 80 * GB, _AS_SOLD, 108, (8, 0), 312.0, 19.5),
    # H100, H200: measured by this project (results/h100-80gb-hbm3/env.txt, results/h200/env.txt)
    GpuProfile("h100", "NVIDIA H100 80GB HBM3", 80, 85017493504, "measured here (results/)", 132,
               (9, 0), 989.0, 67.0),
    GpuProfile("h200", "NVIDIA H200", 141, 150109880320, "measured here (results/)", 132, (9, 0),
               989.0, 67.0),
]}


def gpu_profile(gpu: str | None = None, device: int = 0) -> GpuProfile | None:
    """A card's profile: by key ("t4", "l4", "a10g", "a100-40", "a100-80", "h100", "h200"), or
    for gpu=None this machine's GPU, read from torch (None on a machine without one): its own
    memory, SMs and capability, named after the profile it matches. Introduced in
    00_setup.ipynb."""
    if gpu is not None:
        if gpu not in PROFILES:
            raise FastdiffError(f"Unknown GPU {gpu!r}: use one of {', '.join(PROFILES)}, or "
                                "leave it out for this machine's GPU.")
        return PROFILES[gpu]
    if not torch.cuda.is_available():
        return None
    return from_properties(torch.cuda.get_device_properties(device))


# the word in torch's device name that says which known card it is (an A100's by its memory)
_MARKS = (("T4", "t4"), ("L4", "l4"), ("A10G", "a10g"), ("H100", "h100"), ("H200", "h200"))


def _known(name: str, total_bytes: int) -> GpuProfile | None:
    words = name.replace("-", " ").upper().split()
    if "A100" in words:
        return PROFILES["a100-80" if total_bytes > 60 * GB else "a100-40"]
    return next((PROFILES[key] for mark, key in _MARKS if mark in words), None)


def from_properties(props) -> GpuProfile:
    """A profile from torch's device properties (or their fake): the card's own memory, SMs and
    capability; the key and TFLOPS of the known card it is, else of the nearest below it by
    capability, scaled by SMs (an estimate, for the clock only)."""
    name, total = str(props.name), int(props.total_memory)
    capability = (int(props.major), int(props.minor))
    known = _known(name, total)
    if known is None:
        near = [p for p in PROFILES.values() if p.capability <= capability] or list(PROFILES.values())
        base = max(near, key=lambda p: (p.capability, p.sms))
        scale = props.multi_processor_count / base.sms
        key, tflops, fp32 = "other", base.tflops * scale, base.fp32_tflops * scale
    else:
        key, tflops, fp32 = known.key, known.tflops, known.fp32_tflops
    return GpuProfile(key, name, round(total / GB), total, "this GPU",
                      int(props.multi_processor_count), capability, tflops, fp32)


def fits(profile: GpuProfile, model: str, dtype: str, height: int | None = None,
         width: int | None = None, batch: int = 1) -> tuple[bool, str]:
    """(fits, what it needs against what the card has), e.g. "est. 11.9 of 14.8 GiB"."""
    need = peak_bytes(model, dtype, height, width, batch)
    return need <= profile.total_bytes, f"est. {need / GIB:.1f} of {profile.gib:.1f} GiB"
