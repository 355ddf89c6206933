"""Recipe: the toggles of the course, validated on construction, and BASELINE, the course's
true fp32 baseline. The ladders built from recipes are in ladders.py.

Introduced in 01_baseline.ipynb. Imports nothing of the package but errors.py, the dtype
names (models/dtypes.py) and the GPU profiles' thresholds (models/gpus.py) (techniques import it; the code writer, fdh.to_code(recipe), lives above them in codegen.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..errors import FastdiffError
from ..models.dtypes import RECIPE_DTYPES as DTYPES, fp32_or_half, weight_name
from ..models.gpus import BF16_FROM, FLASH_FROM, FP8_FROM

ATTENTION = ("classic", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn")
COMPILE_MODES = (None, "default", "max-autotune", "max-autotune-no-cudagraphs",
                 "reduce-overhead")
CUDA_ONLY_ATTENTION = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
# "regional": the blocks diffusers declares (_repeated_blocks); "regional-extended": ours, those
# plus the blocks it leaves eager (UNet ResnetBlock2D, PixArt BasicTransformerBlock);
# "regional-accelerate": accelerate's compile_regions.
SCOPES = ("full", "regional", "regional-extended", "regional-accelerate")
# The compile modes that capture CUDA graphs, and the same inductor options without them: torch's
# own option sets for each pair differ by "triton.cudagraphs" alone (torch/_inductor/__init__.py,
# list_mode_options). Where the graphs cannot run, the policy below runs the mode on the right.
NO_CUDAGRAPHS = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "default"}
CUDA_ONLY_COMPILE = tuple(NO_CUDAGRAPHS)
POLICY = "the course's one policy for GPU-only choices: see fdh.Recipe"


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
        # Regional compile with CUDA graphs: the repeated blocks share one compiled function,
        # each call's input is the previous call's output, and the next replay of that
        # function overwrites it ("accessing tensor output of CUDAGraphs that has been
        # overwritten", pytorch/pytorch#152887, open)
        return runs, (f"compile={mode!r} with compile_scope={scope!r} would replay the blocks' "
                      "shared CUDA graph once per block, each replay overwriting the output "
                      f"the next block reads (pytorch/pytorch#152887): ran compile={runs!r} "
                      f"({POLICY})")
    return mode, None


QUANTIZE = (None, "int8-dynamic", "int8-weight-only", "fp8-dynamic", "fp8-dynamic-row")
# fp8 dynamic (torchao's Float8DynamicActivationFloat8WeightConfig): one scale per tensor, or
# one per row of the weight and per token of the activation ("-row")
FP8 = ("fp8-dynamic", "fp8-dynamic-row")
# "blog": diffusion-fast's dynamic_quant_filter_fn, exactly; "fastdiff": the course's own
# heuristic (big linears that see many tokens); "all": every nn.Linear; "flux": Flux's
# (techniques/flux.py: every linear of its transformer, as diffusers-torchao quantized it).
QUANT_FILTERS = ("blog", "fastdiff", "all", "flux")
# "blog": diffusion-fast's filter (1x1 kernel, 128 among in/out channels); "all": ours, every
# pointwise conv. True means "all" (kept for recipes written before the blog's filter existed).
CONV_SWAPS = (False, "blog", "all")
# TF32 for fp32 matmuls and convs (techniques/precision.set_tf32): None follows dtype ("tf32"
# -> "on", else "off"); "blog" and "guide" are the two sources' own switches.
TF32_MODES = ("off", "on", "blog", "guide")


# accelerate's compile_regions compiles the children of a new copy of the module
# (accelerate/utils/other.py, _compile_regions), which the step plan, holding the original's,
# would never run: the pipeline would run uncompiled, silently
ACCELERATE_COPIES = ("compile_scope='regional-accelerate' compiles a copy of the transformer that "
                     "the step cache and PixArt's guidance stop never run: use compile_scope="
                     "'full', 'regional' or 'regional-extended' with them.")


class RecipeError(FastdiffError):
    """An invalid recipe or combination: the message says why and what to do (a FastdiffError,
    so one `except fdh.FastdiffError` catches every refusal of the package)."""


@dataclass(frozen=True)
class Recipe:
    """The techniques to apply to a pipeline. Defaults are the true fp32 baseline.

    dtype: "fp32" (TF32 off) | "tf32" | "bf16" | "fp16"; tf32: None (follows dtype) | "off" |
        "on" | "blog" (torch.set_float32_matmul_precision("high"), as diffusion-fast ran) |
        "guide" (torch.backends.cuda.matmul.allow_tf32 = True, as the diffusers guide shows)
    attention: "classic" (diffusers' non-SDPA processor) | "sdpa" | "sdpa-flash" |
        "sdpa-efficient" | "sdpa-math" | "sdpa-cudnn"
    channels_last: NHWC memory format for the denoiser and VAE
    compile: None | "default" | "max-autotune" | "max-autotune-no-cudagraphs" |
        "reduce-overhead"; compile_scope "full" | "regional" | "regional-extended" |
        "regional-accelerate" (see SCOPES); compile_vae (VAE decode too);
        fullgraph; dynamic (None: torch decides, True/False: force); inductor_flags (the
        blog's four, plus force_fuse_int_mm_with_mul when quantizing; options of the
        pipeline's own compiles, never set process-wide)
    fuse_qkv: one matmul for Q, K and V (needs an SDPA attention)
    no_sync: no device-to-host sync inside the denoising loop
    quantize: None | "int8-dynamic" | "int8-weight-only" | "fp8-dynamic" (one scale per
        tensor) | "fp8-dynamic-row" (per row and token); quant_filter
        "blog" (diffusion-fast's) | "fastdiff" (ours) | "all" | "flux" (Flux's transformer) |
        a callable(module, fqn) -> bool
    conv1x1_to_linear: False | "blog" (diffusion-fast's filter, torchao's swap) | "all" (ours:
        every pointwise conv); True means "all"
    cache_every, cache_branch: the course's step cache (fdh.step_cache): the denoiser's deep
        part on every cache_every-th step only (1: no cache), cache_branch levels or blocks
        recomputed on every step
    guidance_stop: None | the share of the steps that keep classifier-free guidance
        (fdh.stop_guidance; the rest run at batch 1)

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
      imported tuning bundle covers it (techniques/autotune.py; fdh.set_autotune).

    Introduced in 01_baseline.ipynb.
    """

    dtype: str = "fp32"
    tf32: str | None = None
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
    conv1x1_to_linear: bool | str = False
    cache_every: int = 1
    cache_branch: int = 1
    guidance_stop: float | None = None

    def __post_init__(self) -> None:
        if self.conv1x1_to_linear is True or self.conv1x1_to_linear is None:
            object.__setattr__(self, "conv1x1_to_linear", "all" if self.conv1x1_to_linear
                               else False)
        def one_of(name: str, value: Any, allowed: tuple) -> None:
            if value not in allowed:
                shown = ", ".join(repr(a) for a in allowed)
                raise RecipeError(f"Unknown {name} {value!r}. Use one of: {shown}.")

        one_of("dtype", self.dtype, DTYPES)
        one_of("attention", self.attention, ATTENTION)
        one_of("compile", self.compile, COMPILE_MODES)
        one_of("compile_scope", self.compile_scope, SCOPES)
        one_of("quantize", self.quantize, QUANTIZE)
        one_of("tf32", self.tf32, (None,) + TF32_MODES)
        one_of("conv1x1_to_linear", self.conv1x1_to_linear, CONV_SWAPS)
        for name in ("channels_last", "compile_vae", "fullgraph", "inductor_flags", "fuse_qkv",
                     "no_sync"):
            if not isinstance(getattr(self, name), bool):
                raise RecipeError(f"{name}={getattr(self, name)!r}: give True or False.")
        if self.dtype == "tf32" and self.tf32 == "off":
            raise RecipeError("dtype='tf32' with tf32='off' contradicts itself: use dtype='fp32' "
                              "for true fp32, or leave tf32 unset.")
        if not callable(self.quant_filter):
            one_of("quant_filter", self.quant_filter, QUANT_FILTERS)
        for name in ("cache_every", "cache_branch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"{name}={value!r}: give a whole number, 1 or more.")
        if self.guidance_stop is not None and (
                isinstance(self.guidance_stop, bool) or not isinstance(self.guidance_stop,
                                                                       (int, float))
                or not 0 < self.guidance_stop <= 1):
            raise RecipeError(f"guidance_stop={self.guidance_stop!r}: give the share of the "
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
        if cuda and capability is None and self.quantize in FP8:
            import torch

            capability = torch.cuda.get_device_capability(device)
        if not cuda and self.attention in CUDA_ONLY_ATTENTION:
            raise RecipeError(f"attention={self.attention!r} is a CUDA kernel; on {device} use "
                              "'sdpa' or 'sdpa-math'.")
        if cuda and self.attention == "sdpa-flash":
            if capability is None and torch.cuda.is_available():
                capability = torch.cuda.get_device_capability(device)
            if capability is not None and tuple(capability) < FLASH_FROM:
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


BASELINE = Recipe()  # the course's true fp32 baseline: TF32 off, classic attention
_ID_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Recipe) if f.name != "compile"}


def recipe_id(recipe: dict | None) -> str:
    """A short, stable name of a compiled recipe (a Recipe.to_dict(): "compile" and the fields
    away from their defaults), telling its graphs from another recipe's in the course clock's
    record; "compile_pipeline" for a compile outside fdh.apply."""
    if recipe is None:
        return "compile_pipeline"
    return json.dumps({k: v for k, v in recipe.items() if _ID_DEFAULTS.get(k, "?") != v},
                      sort_keys=True, default=str)
