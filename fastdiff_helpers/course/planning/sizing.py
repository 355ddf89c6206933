"""The course sized for the card it runs on: one policy that course_settings, run_ladder and
`python -m fastdiff_helpers plan` all ask. For a card (fdh.course.gpu_profile) and a model: the
size, steps, timed runs and largest batch that fit; for a recipe, whether it runs as written, runs
swapped (bf16 as fp16 below sm80), or is skipped, with the reason, before anything loads.

Introduced in 00_setup.ipynb."""

from __future__ import annotations

from dataclasses import dataclass

from ... import checks
from ...models.fit import GIB
from .gpus import PROFILES, TEMPLATE_SMS, GpuProfile, fits
from ...models.presets import get_spec
from ...techniques.recipe import Recipe, RecipeError
from .image_time import image_seconds

# the memory lesson's cards (fdh.course.CARDS, the sizes fdh.what_fits is asked about), by memory as
# sold: "16 GB" is 16e9 bytes, 14.9 GiB (a T4's driver reports 14.76), less the CUDA context's and
# allocator's few hundred MiB. A workshop GPU's size is its profile's (planning/gpus.py; the
# A10G's, A100 80GB's: the L4's, H100's), the rest consumer.
CARDS = {f"{gb} GB ({names})": gb * 1e9 / GIB for gb, names in (
    (8, "RTX 3070, RTX 4060"), (12, "RTX 3060, RTX 4070"),
    (PROFILES["t4"].memory_gb, "T4, RTX 4060 Ti 16GB, RTX 4080"),
    (PROFILES["l4"].memory_gb, "A10G, L4, RTX 3090, RTX 4090"), (48, "L40S, RTX 6000 Ada"),
    (PROFILES["h100"].memory_gb, "A100 80GB, H100"))}

# timed runs a benchmark takes on a GPU: 5 where an image takes under TIMED_S / 5 seconds, fewer
# on slower cards (never under 2: a median needs them), so a benchmark cell answers in about a
# minute; one warm-up where an image takes over SLOW_IMAGE_S
RUNS, MIN_RUNS, TIMED_S, SLOW_IMAGE_S = 5, 2, 60.0, 10.0
SIZES = (1024, 896, 768, 640, 512)  # what a card too small for the native size tries, in order
MAX_BATCH = 8


@dataclass(frozen=True)
class CardFit:
    """What a card gets for a model: size, timed runs, warm-ups, the largest batch that fits at
    that size in half precision, and whether the fp32 rungs fit (with the estimates)."""

    size: int | None
    runs: int
    warmup: int
    max_batch: int
    half: str
    half_need: str
    fp32_fits: bool
    fp32_need: str

    def line(self, profile: GpuProfile, model: str, steps: int) -> str:
        """The one line course_settings prints."""
        spec = get_spec(model)
        if self.size is None:
            return (f"fastdiff: {spec.key} does not fit {profile.name} ({profile.gib:.1f} GiB) "
                    f"even at {SIZES[-1]} px in {self.half} ({self.half_need}): its cells are "
                    "skipped on this card; the plan (python -m fastdiff_helpers plan) says "
                    "which card runs it")
        swapped = "" if self.half == "bf16" else (" (bf16 runs as fp16 here: inductor compiles "
                                                  "no bf16 graph below sm80)")
        smaller = "" if self.size == spec.resolution else f" (native {spec.resolution} does not fit)"
        fp32 = ("fp32 fits" if self.fp32_fits else f"fp32 does not fit: the baseline runs in "
                f"{self.half} (settings.baseline), fp32 rungs are skipped")
        return (f"fastdiff: sized for {profile.name} ({profile.gib:.1f} GiB, sm"
                f"{profile.capability[0]}{profile.capability[1]}, {profile.sms} SMs): "
                f"{spec.key} at {self.size}x{self.size}{smaller} in {self.half}{swapped} "
                f"({self.half_need}), {steps} steps, {self.runs} timed runs after "
                f"{self.warmup} warm-up(s), batch up to {self.max_batch}; {fp32} "
                f"({self.fp32_need})")


def card_fit(profile: GpuProfile, model: str, size: int | None = None) -> CardFit:
    """The policy for `model` on `profile` (a given `size` is kept, and judged)."""
    spec = get_spec(model)
    checks.image_size("size", size, spec.size_multiple)
    tried = [size] if size else [s for s in SIZES if s <= spec.resolution] or [spec.resolution]
    half = profile.half
    chosen = next((s for s in tried if fits(profile, spec.key, half, s, s)[0]), None)
    judged = chosen or tried[-1]
    batch = max([b for b in range(1, MAX_BATCH + 1)
                 if fits(profile, spec.key, half, judged, judged, b)[0]] or [0])
    one = image_seconds(profile, spec.key, "+ SDPA", size=judged)
    runs = max(MIN_RUNS, min(RUNS, int(TIMED_S // max(one, 1e-9))))
    fp32_ok, fp32_need = fits(profile, spec.key, "fp32", judged, judged)
    half_need = fits(profile, spec.key, half, judged, judged)[1]
    return CardFit(size=chosen, runs=runs, warmup=1 if one > SLOW_IMAGE_S else 2,
                   max_batch=batch, half=half, half_need=half_need,
                   fp32_fits=fp32_ok, fp32_need=fp32_need)


def rung_verdict(profile: GpuProfile, model: str, recipe: Recipe, size: int | None = None,
                 batch: int = 1, memory: bool = True) -> tuple[str, Recipe, list[str]]:
    """("runs" | "swapped" | "skipped", the recipe the card runs, the reasons): the recipe as
    fdh.apply adapts it on this card (Recipe.for_device with its compute capability), refused
    where it names hardware the card lacks (Recipe.check_device: fp8 below sm89, flash
    attention below sm80), skipped where its estimated peak does not fit the card's memory
    (unless `memory=False`: tiny weights); and a word where max-autotune tunes no GEMM/conv
    template (under 68 SMs)."""
    adapted, notes = recipe.for_device("cuda", profile.capability)
    try:
        adapted.check_device("cuda", profile.capability)
    except RecipeError as exc:
        return "skipped", adapted, [str(exc)]
    dtype = adapted.weight_dtype
    ok, need = fits(profile, model, dtype, size, size, batch) if memory else (True, "")
    if not ok:
        return "skipped", adapted, [no_fit(profile, model, dtype, need)]
    if adapted.compile and adapted.compile.startswith("max-autotune") and \
            not profile.gemm_templates:
        notes.append(f"with autotuning on, max-autotune tunes no GEMM or convolution template "
                     f"on {profile.sms} SMs "
                     f"(torch/_inductor/utils.py is_big_gpu needs {TEMPLATE_SMS}): only its "
                     "pointwise/reduction kernels' configs are searched")
    return ("swapped" if adapted.dtype != recipe.dtype else "runs"), adapted, notes


def no_fit(profile: GpuProfile, model: str, dtype: str, need: str) -> str:
    """The one wording of a model that does not fit a card (the plan and the ladder say it)."""
    return f"{model} in {dtype} does not fit {profile.name}: {need} (models/fit.py peak_bytes)"



def fitting_sizes(profile: GpuProfile, model: str, sizes) -> list[int]:
    """The square `sizes` whose estimated peak in the card's half precision fits it; those left
    out are said in one line."""
    kept, left = [], []
    for size in sizes:
        ok, need = fits(profile, model, profile.half, size, size)
        (kept if ok else left).append((size, need))
    if left:
        print(f"fastdiff: left out on {profile.name}: " + ", ".join(
            f"{size}x{size} ({need})" for size, need in left))
    return [size for size, _ in kept]
