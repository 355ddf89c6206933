"""Recipe: the toggles of the course, validated on construction, and BASELINE, the course's
true fp32 baseline. The ladders built from recipes are in ladders.py.

Introduced in 01_baseline.ipynb. Imports nothing of the package but errors.py and the dtype
names and capability thresholds (models/dtypes.py). The techniques import it; the code writer,
fdh.to_code(recipe), lives above them in codegen.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..errors import FastdiffError
from ..models.dtypes import (BF16_FROM, FLASH_FROM, FP8_FROM, RECIPE_DTYPES as DTYPES,
                             fp32_or_half, weight_name)

ATTENTION = ("classic", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn")
COMPILE_MODES = (None, "default", "max-autotune", "max-autotune-no-cudagraphs",
                 "reduce-overhead")
CUDA_ONLY_ATTENTION = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
QUANTIZE = (None, "int8-dynamic", "int8-weight-only", "fp8-dynamic", "fp8-dynamic-row")
FP8 = ("fp8-dynamic", "fp8-dynamic-row")
QUANT_FILTERS = ("blog", "fastdiff", "all", "flux")
# True means "all" (kept for recipes written before the blog's filter existed)
CONV_SWAPS = (False, "blog", "all")
TF32_MODES = ("off", "on", "blog", "guide")
# "regional": the blocks diffusers declares (_repeated_blocks); "regional-extended": ours, those
# plus the blocks it leaves eager (UNet ResnetBlock2D, PixArt BasicTransformerBlock);
# "regional-accelerate": accelerate's compile_regions.
SCOPES = ("full", "regional", "regional-extended", "regional-accelerate")
# The compile modes that capture CUDA graphs, and the same inductor options without them: torch's
# own option sets for each pair differ by "triton.cudagraphs" alone (torch/_inductor/__init__.py,
# list_mode_options). Where the graphs cannot run, the policy below runs the mode on the right.
NO_CUDAGRAPHS = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "default"}
POLICY = "the course's one policy for GPU-only choices: see fdh.Recipe"

# accelerate's compile_regions compiles the children of a new copy of the module
# (accelerate/utils/other.py, _compile_regions), which the step plan, holding the original's,
# would never run: the pipeline would run uncompiled, silently
ACCELERATE_COPIES = ("compile_scope='regional-accelerate' compiles a copy of the transformer that "
                     "the step cache and PixArt's guidance stop never run: use compile_scope="
                     "'full', 'regional' or 'regional-extended' with them.")


def compile_mode_for(mode: str | None, scope: str, device: str) -> tuple[str | None, str | None]:
    """The mode torch.compile gets on `device` under the policy (see Recipe), and the note that
    says why when it is not `mode` (None when unchanged)."""
    if mode not in NO_CUDAGRAPHS:
        return mode, None
    runs = NO_CUDAGRAPHS[mode]
    if not str(device).startswith("cuda"):
        # torch captures nothing there itself: with graph partitioning (on by default,
        # torch/_inductor/config.py:569) every CPU op stays outside the partitions that CUDA
        # graphs capture (scheduler.py:8578), so a CPU graph has none: the same run, said up front
        return runs, (f"compile={mode!r} on {device}: ran compile={runs!r}, the same inductor "
                      f"options without the CUDA graphs a {device} cannot capture ({POLICY})")
    if scope != "full":
        # torch's error then: "accessing tensor output of CUDAGraphs that has been overwritten"
        # (pytorch/pytorch#152887, open)
        return runs, (f"compile={mode!r} with compile_scope={scope!r} would replay the blocks' "
                      "shared CUDA graph once per block, each replay overwriting the output "
                      f"the next block reads (pytorch/pytorch#152887): ran compile={runs!r} "
                      f"({POLICY})")
    return mode, None


class RecipeError(FastdiffError):
    """An invalid recipe or combination: the message says why and what to do (a FastdiffError,
    so one `except fdh.FastdiffError` catches every refusal of the package)."""


@dataclass(frozen=True)
class Knob:
    """What every surface reads of one Recipe field: the field's metadata (KNOBS[name]).

    step: the technique that applies it (techniques/__init__.py STEPS, in fdh.apply's order: its
        place in the order, its code lines in fdh.to_code, its reading back in
        fdh.current_recipe); label: the playground's widget; help: the command line's help (the
        flag is --name-with-dashes, --no-name for a switch that is on by default); choices: the
        values it takes (none: a whole number, or a share); widget: the playground's values
        where they are not the choices; unset: the playground's word for None (or False);
        cost: what prices it in the course's time estimates (course/planning/image_time.py):
        "path" (it picks the precision and compile path), or {value: (words, published step,
        the step it is measured against)}, the published ratio of two steps of a ladder."""
    step: str
    label: str
    help: str = ""
    choices: tuple = ()
    widget: tuple = ()
    unset: str = "off"
    cost: Any = None


def _knob(default: Any, step: str, label: str, help: str = "", choices: tuple = (),
          **more: Any) -> Any:
    return field(default=default, metadata={"knob": Knob(step, label, help, choices, **more)})


_SWITCH = (False, True)
_INT8 = ("int8", "+ int8 dynamic", "+ fused QKV")  # the blog's A100 rows
_QUANT_COST = {"int8-dynamic": _INT8, "int8-weight-only": _INT8,
               # diffusers-torchao's H100 rows of FLUX.1-dev, each against its compiled row
               "fp8-dynamic": ("fp8", "+ fp8 dynamic", "+ compile"),
               "fp8-dynamic-row": ("fp8", "+ fp8 dynamic row", "+ compile")}


@dataclass(frozen=True)
class Recipe:
    """The techniques to apply to a pipeline. Defaults are the true fp32 baseline. Each field
    says what it is in its Knob (KNOBS[name].help, `python -m fastdiff_helpers bench --help`).

    GPU-only choices on a machine without them: one policy, applied by fdh.apply and so the
    same in the CLI, run_ladder, `make demo` and the playground (Recipe.for_device makes the
    changes, Recipe.check_device the refusals, both before any work):
    - what only changes how a GPU runs the same work is dropped, with a note, as torch itself
      drops it: the CUDA graphs of compile="max-autotune" (which then runs as
      "max-autotune-no-cudagraphs", the same inductor options) and of "reduce-overhead" (then
      "default"), on a CPU, and on a GPU with a regional compile_scope (pytorch#152887);
    - what names hardware the machine lacks is refused, naming what to use instead: a CUDA
      attention kernel ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn") off CUDA, and
      fp8 ("fp8-dynamic", "fp8-dynamic-row") below compute capability 8.9;
    - what would tune for minutes on a GPU (max-autotune, the blog's coordinate descent) runs
      its default-mode equivalent, said in one line, unless autotuning is switched on or an
      imported tuning bundle covers it (course/planning/autotune.py; fdh.course.set_autotune).

    Introduced in 01_baseline.ipynb.
    """

    dtype: str = _knob("fp32", "precision", "dtype", "fp32 (TF32 off), tf32, bf16 or fp16",
                       DTYPES, cost="path")
    tf32: str | None = _knob(None, "precision", "TF32", "TF32 switch (default: on only for "
                             "--dtype tf32); blog: set_float32_matmul_precision('high'), "
                             "guide: matmul.allow_tf32", (None,) + TF32_MODES, unset="auto",
                             cost="path")
    attention: str = _knob("classic", "attention", "attention", "classic (diffusers' non-SDPA "
                           "processor), sdpa, or one SDPA kernel pinned", ATTENTION, cost="path")
    channels_last: bool = _knob(False, "channels_last", "channels_last", "NHWC memory format "
                                "for the denoiser and VAE", _SWITCH)
    compile: str | None = _knob(None, "compile", "compile", "torch.compile's mode",
                                COMPILE_MODES, cost="path")
    compile_scope: str = _knob("full", "compile", "compile scope", "the whole denoiser, or its "
                               "blocks (see SCOPES)", SCOPES)
    compile_vae: bool = _knob(True, "compile", "compile VAE", "compile the VAE decode too",
                              _SWITCH)
    fullgraph: bool = _knob(False, "compile", "fullgraph", "one graph, or an error", _SWITCH)
    dynamic: bool | None = _knob(None, "compile", "dynamic", "dynamic shapes (default: torch "
                                 "decides)", (None, True, False), widget=("auto", "True", "False"),
                                 unset="auto")
    inductor_flags: bool = _knob(False, "compile", "inductor flags", "the blog's four inductor "
                                 "flags (plus force_fuse_int_mm_with_mul with int8), for these "
                                 "compiles only", _SWITCH)
    fuse_qkv: bool = _knob(False, "fuse_qkv", "fused QKV", "one matmul for Q, K and V (needs "
                           "an SDPA attention)", _SWITCH,
                           cost={True: ("fused QKV", "+ fused QKV", "+ compile")})
    no_sync: bool = _knob(False, "no_sync", "no GPU syncs", "no device-to-host sync inside the "
                          "denoising loop", _SWITCH)
    quantize: str | None = _knob(None, "quantize", "quantize", "torchao quantization of the "
                                 "denoiser's and VAE's linears", QUANTIZE, cost=_QUANT_COST)
    quant_filter: str | Callable[..., bool] = _knob(
        "blog", "quantize", "quant filter", "which linears: blog (diffusion-fast's), fastdiff "
        "(ours), all, flux (Flux's transformer), or a callable(module, fqn) -> bool",
        QUANT_FILTERS)
    conv1x1_to_linear: bool | str = _knob(
        False, "conv1x1_to_linear", "1x1 conv to linear", "swap 1x1 convs for linears: blog "
        "(diffusion-fast's filter) or all (ours: every pointwise conv); True means all",
        CONV_SWAPS)
    cache_every: int = _knob(1, "step_cache", "step cache every", "step cache: deep part every "
                             "N steps (1: no cache)", widget=(1, 2, 3, 4, 5))
    cache_branch: int = _knob(1, "step_cache", "cache branch", "step cache: levels (UNet) or "
                              "blocks kept fresh on every step", widget=(1, 2, 3))
    guidance_stop: float | None = _knob(None, "guidance_stop", "guidance on first",
                                        "guidance on this share of the steps (default: all)",
                                        widget=("off", 0.25, 0.5, 0.75))

    def __post_init__(self) -> None:
        if self.conv1x1_to_linear is True or self.conv1x1_to_linear is None:
            object.__setattr__(self, "conv1x1_to_linear", "all" if self.conv1x1_to_linear
                               else False)
        def one_of(name: str, value: Any, allowed: tuple) -> None:
            if value not in allowed:
                shown = ", ".join(repr(a) for a in allowed)
                raise RecipeError(f"Unknown {name} {value!r}. Use one of: {shown}.")

        for f in dataclasses.fields(self):
            choices = f.metadata["knob"].choices
            if choices == _SWITCH:
                if not isinstance(getattr(self, f.name), bool):
                    raise RecipeError(f"{f.name}={getattr(self, f.name)!r}: give True or False.")
            elif choices and f.name not in ("quant_filter", "dynamic"):
                one_of(f.name, getattr(self, f.name), choices)
        if self.dtype == "tf32" and self.tf32 == "off":
            raise RecipeError("dtype='tf32' with tf32='off' contradicts itself: use dtype='fp32' "
                              "for true fp32, or leave tf32 unset.")
        if not callable(self.quant_filter):
            one_of("quant_filter", self.quant_filter, QUANT_FILTERS)
        for name in ("cache_every", "cache_branch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"{name}={value!r}: give a whole number, 1 or more.")
        share = self.guidance_stop
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise RecipeError(f"guidance_stop={share!r}: give the share of the "
                              "steps that keep guidance, above 0 and at most 1, or None.")
        if self.compile_scope == "regional-accelerate" and (self.cache_every > 1 or
                                                            self.guidance_stop is not None):
            raise RecipeError(ACCELERATE_COPIES)
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
        if self.attention in ("sdpa-flash", "sdpa-cudnn") and fp32_or_half(self.dtype) == "fp32":
            # torch's cuda/sdp_utils.cpp: check_dtypes_flash_attention, check_dtypes_low_precision
            raise RecipeError(f"attention={self.attention!r} runs only in fp16/bf16: set "
                              "dtype='bf16', or use 'sdpa-efficient' or 'sdpa-math' in fp32.")
        if self.quantize not in (None, "int8-weight-only") and fp32_or_half(self.dtype) == "fp32":
            raise RecipeError(f"quantize={self.quantize!r} is meant for bf16 models (the blog "
                              "quantizes a bf16 UNet): set dtype='bf16'.")
        if self.quantize == "fp8-dynamic-row" and self.dtype != "bf16":
            # torchao/quantization/quant_api.py: "PerRow quantization only works for bfloat16
            # precision input weight" (an assert, after loading)
            raise RecipeError("quantize='fp8-dynamic-row' needs bf16 weights (torchao's per-row "
                              "fp8 takes only bf16): set dtype='bf16', or use 'fp8-dynamic'.")

    # -- checks that depend on the machine ------------------------------------------------

    def check_device(self, device: str, capability: tuple[int, int] | None = None) -> None:
        """Refuse, before any work, what names hardware this device lacks (the policy in the
        class docstring); `capability` (the CUDA compute capability) is read from the device
        when not given. What only needs adapting (CUDA graphs) passes: see for_device."""
        cuda = device.startswith("cuda")
        flash = cuda and self.attention == "sdpa-flash"
        if cuda and capability is None and (self.quantize in FP8
                                            or (flash and torch.cuda.is_available())):
            capability = torch.cuda.get_device_capability(device)
        if not cuda and self.attention in CUDA_ONLY_ATTENTION:
            raise RecipeError(f"attention={self.attention!r} is a CUDA kernel; on {device} use "
                              "'sdpa' or 'sdpa-math'.")
        if flash and capability is not None and tuple(capability) < FLASH_FROM:
            raise RecipeError(f"attention='sdpa-flash' needs compute capability 8.0+ (torch's "
                              "sdp_utils.cpp check_flash_attention_hardware_support: sm80 "
                              f"to sm121); this GPU has {tuple(capability)}. Use 'sdpa' "
                              "(torch picks memory-efficient attention here) or "
                              "'sdpa-efficient'.")
        if self.quantize in FP8:
            if not cuda or capability is None or capability < FP8_FROM:
                have = f"compute capability {capability}" if cuda else device
                raise RecipeError(f"{self.quantize} needs a GPU with fp8 tensor cores (compute "
                                  f"capability 8.9+: L4, H100, H200...); this has {have}. Use "
                                  "quantize='int8-dynamic'.")

    @property
    def weight_dtype(self) -> str:
        """The dtype its pipeline's weights load in: fp32 for "fp32" and "tf32" (TF32 is a
        matmul setting), else its own. fdh.load_pipeline(..., dtype=recipe.weight_dtype) fetches
        the files of that dtype (fp16 files for a half-precision recipe, where the hub has
        them). Introduced in 16_where_the_time_goes.ipynb."""
        return weight_name(self.dtype)

    def for_device(self, device: str, capability: tuple[int, int] | None = None
                   ) -> tuple["Recipe", list[str]]:
        """The recipe this device runs under the policy (class docstring), and a note for each
        change made: CUDA graphs dropped off CUDA, and on CUDA with a regional scope; bf16 run
        as fp16 below compute capability 8.0 (`capability`: read from this machine's GPU when
        not given, e.g. (7, 5) for a T4), where inductor would skip every bf16 graph."""
        recipe, notes = self, []
        mode, note = compile_mode_for(self.compile, self.compile_scope, str(device))
        if note is not None:
            recipe, notes = replace(recipe, compile=mode), [note]
        if str(device).startswith("cuda") and self.dtype == "bf16" and self.quantize not in FP8:
            # (fp8 is refused below sm89 by check_device, with its own reason)
            if capability is None and torch.cuda.is_available():
                capability = torch.cuda.get_device_capability(device)
            if capability is not None and tuple(capability) < BF16_FROM:
                recipe = replace(recipe, dtype="fp16")
                notes.append(f"dtype='bf16' on compute capability {tuple(capability)}: ran "
                             "dtype='fp16', the same half precision in the format this GPU's "
                             "tensor cores have; inductor skips a bf16 graph below 8.0 (torch/"
                             "_inductor/compile_fx.py _check_triton_bf16_support), so a "
                             f"compiled bf16 rung would run eager ({POLICY})")
        return recipe, notes

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


KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in dataclasses.fields(Recipe)}
BASELINE = Recipe()  # the course's true fp32 baseline: TF32 off, classic attention
