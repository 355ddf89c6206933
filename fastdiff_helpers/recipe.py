"""Recipe: the toggles of the course, validated on construction; LADDER: the blog's steps.

Introduced in 01_baseline.ipynb. Imports nothing of the package but the code writer
(techniques import this module, never the reverse, except to_code() reading their source).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, Callable

DTYPES = ("fp32", "tf32", "bf16", "fp16")
ATTENTION = ("classic", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn")
COMPILE_MODES = (None, "default", "max-autotune", "max-autotune-no-cudagraphs",
                 "reduce-overhead")
CUDA_ONLY_COMPILE = ("max-autotune", "reduce-overhead")  # both capture CUDA graphs
CUDA_ONLY_ATTENTION = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
# Regional compile with CUDA graphs: each compiled block replays its own graph, whose output
# buffer the next replay overwrites while the next block still reads it ("accessing tensor
# output of CUDAGraphs that has been overwritten", pytorch/pytorch#152887, open). The same
# inductor mode without graphs:
REGIONAL_COMPILE = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "default"}
REGIONAL_CUDAGRAPH_ERROR = (
    "compile={mode!r} with compile_scope='regional' captures one CUDA graph per block, and each "
    "block's replay overwrites the output the next block reads (pytorch/pytorch#152887). Use "
    "compile={fix!r} with 'regional', or compile_scope='full' (Recipe.for_device makes the "
    "change for you).")
SCOPES = ("full", "regional")
QUANTIZE = (None, "int8-dynamic", "int8-weight-only", "fp8-dynamic")
QUANT_FILTERS = ("blog", "all")


class RecipeError(ValueError):
    """An invalid recipe or combination: the message says why and what to do."""


@dataclass(frozen=True)
class Recipe:
    """The techniques to apply to a pipeline. Defaults are the true fp32 baseline.

    dtype: "fp32" (TF32 off) | "tf32" | "bf16" | "fp16"
    attention: "classic" (diffusers' non-SDPA processor) | "sdpa" | "sdpa-flash" |
        "sdpa-efficient" | "sdpa-math" | "sdpa-cudnn"
    channels_last: NHWC memory format for the denoiser and VAE
    compile: None | "default" | "max-autotune" | "max-autotune-no-cudagraphs" |
        "reduce-overhead"; compile_scope "full" | "regional"; compile_vae (VAE decode too);
        fullgraph; dynamic (None: torch decides, True/False: force); inductor_flags (the
        blog's four, plus the two quantization flags when quantizing)
    fuse_qkv: one matmul for Q, K and V (needs an SDPA attention)
    no_sync: no device-to-host sync inside the denoising loop
    quantize: None | "int8-dynamic" | "int8-weight-only" | "fp8-dynamic"; quant_filter
        "blog" | "all" | a callable(module, fqn) -> bool; conv1x1_to_linear
    """

    dtype: str = "fp32"
    attention: str = "classic"
    channels_last: bool = False
    compile: str | None = None
    compile_scope: str = "full"
    compile_vae: bool = True
    fullgraph: bool = False
    dynamic: bool | None = None
    inductor_flags: bool = False
    fuse_qkv: bool = False
    no_sync: bool = False
    quantize: str | None = None
    quant_filter: str | Callable[..., bool] = field(default="blog", compare=True)
    conv1x1_to_linear: bool = False

    def __post_init__(self) -> None:
        def one_of(name: str, value: Any, allowed: tuple) -> None:
            if value not in allowed:
                shown = ", ".join(repr(a) for a in allowed)
                raise RecipeError(f"Unknown {name} {value!r}. Use one of: {shown}.")

        one_of("dtype", self.dtype, DTYPES)
        one_of("attention", self.attention, ATTENTION)
        one_of("compile", self.compile, COMPILE_MODES)
        one_of("compile_scope", self.compile_scope, SCOPES)
        one_of("quantize", self.quantize, QUANTIZE)
        if not callable(self.quant_filter):
            one_of("quant_filter", self.quant_filter, QUANT_FILTERS)
        if self.dynamic not in (None, True, False):
            raise RecipeError(f"dynamic must be None, True or False, not {self.dynamic!r}.")
        if self.compile is None:
            for name in ("fullgraph", "inductor_flags"):
                if getattr(self, name):
                    raise RecipeError(f"{name}=True needs compile: set compile='max-autotune' "
                                      "(or another mode) as well.")
            if self.compile_scope != "full" or self.dynamic is not None:
                raise RecipeError("compile_scope and dynamic need compile: set compile too.")
        if self.fuse_qkv and self.attention == "classic":
            raise RecipeError("fuse_qkv needs an SDPA attention (diffusers' fused processor "
                              "calls scaled_dot_product_attention): set attention='sdpa'.")
        if self.attention in ("sdpa-flash", "sdpa-cudnn") and self.dtype in ("fp32", "tf32"):
            # torch's cuda/sdp_utils.cpp: check_dtypes_flash_attention, check_dtypes_low_precision
            raise RecipeError(f"attention={self.attention!r} runs only in fp16/bf16: set "
                              "dtype='bf16', or use 'sdpa-efficient' or 'sdpa-math' in fp32.")
        if self.quantize and self.dtype in ("fp32", "tf32") and self.quantize != "int8-weight-only":
            raise RecipeError(f"quantize={self.quantize!r} is meant for bf16 models (the blog "
                              "quantizes a bf16 UNet): set dtype='bf16'.")

    # -- checks that depend on the machine ------------------------------------------------

    def check_device(self, device: str, capability: tuple[int, int] | None = None) -> None:
        """Refuse, before any work, what this device cannot run. `capability` (the CUDA
        compute capability) is read from the device when not given."""
        cuda = device.startswith("cuda")
        if cuda and capability is None and self.quantize == "fp8-dynamic":
            import torch

            capability = torch.cuda.get_device_capability(device)
        if not cuda and self.attention in CUDA_ONLY_ATTENTION:
            raise RecipeError(f"attention={self.attention!r} is a CUDA kernel; on {device} use "
                              "'sdpa' or 'sdpa-math'.")
        if cuda and self.compile_scope == "regional" and self.compile in REGIONAL_COMPILE:
            raise RecipeError(REGIONAL_CUDAGRAPH_ERROR.format(
                mode=self.compile, fix=REGIONAL_COMPILE[self.compile]))
        if not cuda and self.compile in CUDA_ONLY_COMPILE:
            raise RecipeError(f"compile={self.compile!r} captures CUDA graphs and needs a GPU; "
                              f"on {device} use 'default' or 'max-autotune-no-cudagraphs' "
                              "(or Recipe.for_device(device)).")
        if self.quantize == "fp8-dynamic":
            if not cuda or capability is None or capability < (8, 9):
                have = f"compute capability {capability}" if cuda else device
                raise RecipeError(f"fp8-dynamic needs a GPU with fp8 tensor cores (compute "
                                  f"capability 8.9+: L4, H100, H200...); this has {have}. Use "
                                  "quantize='int8-dynamic'.")

    def for_device(self, device: str) -> tuple["Recipe", list[str]]:
        """The closest recipe this device can run, and a note for each change made."""
        if self.compile not in CUDA_ONLY_COMPILE:
            return self, []
        if not device.startswith("cuda"):
            note = (f"compile={self.compile!r} needs CUDA graphs: ran compile='default' on "
                    f"{device}")
            return replace(self, compile="default"), [note]
        if self.compile_scope == "regional":
            fix = REGIONAL_COMPILE[self.compile]
            note = (f"compile={self.compile!r} with compile_scope='regional' would replay one "
                    "CUDA graph per block, each overwriting the output the next block reads "
                    f"(pytorch/pytorch#152887): ran compile={fix!r}")
            return replace(self, compile=fix), [note]
        return self, []

    # -- records ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if callable(self.quant_filter):
            d["quant_filter"] = f"callable:{getattr(self.quant_filter, '__name__', '?')}"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recipe":
        return cls(**d)

    def changes(self, other: "Recipe") -> list[str]:
        """Field names whose value differs from `other`."""
        return [f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]

    def to_code(self, flavour: str = "fdh") -> str:
        """Python source that applies this recipe to a loaded `pipe`.

        flavour "fdh": one fastdiff_helpers call per technique; "plain": only diffusers,
        torch and torchao. Introduced in 01_baseline.ipynb."""
        from .codegen import recipe_to_code
        return recipe_to_code(self, flavour)


BASELINE = Recipe()
_BF16 = replace(BASELINE, dtype="bf16")
_SDPA = replace(_BF16, attention="sdpa")
_COMPILED = replace(_SDPA, compile="max-autotune", fullgraph=True, inductor_flags=True,
                    channels_last=True, compile_vae=True)
_FUSED = replace(_COMPILED, fuse_qkv=True)
_INT8 = replace(_FUSED, quantize="int8-dynamic", quant_filter="blog")

# The blog's cumulative steps; each changes one thing of the one before (tested).
LADDER: list[tuple[str, Recipe]] = [
    ("fp32", BASELINE),
    ("bf16", _BF16),
    ("+ SDPA", _SDPA),
    ("+ compile", _COMPILED),
    ("+ fused QKV", _FUSED),
    ("+ int8 dynamic", _INT8),
]
