"""Whether a compile may tune: fusion and autotuning are two ideas with two waits.

Introduced in 13_autotuning.ipynb (the search and its cost) and 05_cold_start.ipynb.
On a CUDA GPU, compile="max-autotune" (and "max-autotune-no-cudagraphs") benchmarks the
candidate kernels of every GEMM and convolution shape (GPUs with 68+ SMs only: torch/_inductor/
utils.py, is_big_gpu) and, with coordinate_descent_tuning (which those modes set, and which is
one of the blog's four inductor flags), tunes every generated Triton kernel's launch
configuration: on this project's H200, SDXL's UNet took 4-41 s a shape, 28 shapes in 480 s,
before any coordinate descent (results/h200/slot-2026-11-26.md). The course starts that only
- when the learner switched autotuning on (set_autotune(True), fdh.course.settings(...,
  autotune=True), FASTDIFF_AUTOTUNE=1, --autotune on the command line), or
- where an imported tuning bundle of this GPU and torch covers the compile (the bundles'
  import registers what each covers, course/planning/tuning_state.py): the tuning is read, not run.
Otherwise the compile runs its default-mode equivalent (the same CUDA graphs, no tuning) and
says so in one line with the tuning it skipped. A CPU tunes nothing in these modes (inductor's
C++ GEMM templates tune only with freezing, torch/_inductor/config.py), so nothing changes there.

Imports the models (the shape count runs a meta copy) and the recipe, nothing of measure.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import checks
from ...models.loading import family_of, get_denoiser, pipeline_info
from .gpus import PROFILES, TEMPLATE_SMS
from .shapes import gemm_shapes
from ...models.presets import get_spec
from .compile_cache import use_course_cache
from .coordesc import keep_coordesc_marks
from ...techniques.recipe import Recipe, RecipeError
from .tuning_state import STATE, coverage_key, covered_by, seeded_from

# The modes whose options tune (torch._inductor.list_mode_options: both set max_autotune and
# coordinate_descent_tuning), and the mode with the same CUDA-graph choice that tunes nothing
# ("reduce-overhead" sets only triton.cudagraphs; "default" sets nothing).
WITHOUT_TUNING = {"max-autotune": "reduce-overhead", "max-autotune-no-cudagraphs": "default"}
# Measured: SDXL's UNet, bf16, 1024x1024, batch 2, on an H200 with torch 2.11: 28 shapes
# autotuned in 347.6 s of benchmarking, 4.2 to 40.8 s a shape (results/h200/slot-2026-11-26.md)
SHAPE_S = 347.6 / 28
SHAPE_S_RANGE = (4.2, 40.8)
SHAPES_WHERE = "results/h200/slot-2026-11-26.md: 28 SDXL shapes in 347.6 s on an H200"
# A default-mode compile, measured: SDXL's UNet and VAE decode (GRAPH_OPS below, 2222 + 149
# ops), compile="reduce-overhead", bf16, 1024x1024, on this project's H200 (16 CPU cores) with
# torch 2.11: 110.8 s of dynamo (19.0 s) and inductor (91.8 s) in the first call's cold start
# (results/h200/sdxl-course/results.jsonl, '+ compile', cold_start_split; slot-2026-11-29.md).
# Every graph is estimated at its seconds an op (about 47 ms), but FLUX.1-dev's transformer,
# which keeps its own published figure: 67.4 s on an H100 (PyTorch devlog "torch.compile and
# Diffusers", 2026-05), about 19 ms an op.
DEFAULT_GRAPH_S = 110.8
REGIONAL_S = 9.6  # the same devlog: FLUX.1-dev's transformer compiled regionally
FLUX_GRAPH_S = 67.4
# A graph's compile time scales with its size: the ops dynamo captures in one call of each
# full-size part at its native size (tools/graph_ops.py, counted on meta copies, each in
# a fresh process: a count moves a few % with what dynamo traced before in the process)
GRAPH_OPS = {("sdxl", "denoiser"): 2222, ("sd15", "denoiser"): 839,
             ("ssd1b", "denoiser"): 1233, ("pixart", "denoiser"): 1165,
             ("flux", "denoiser"): 3517, ("flux", "vae"): 148}
VAE_OPS = 149  # the AutoencoderKL decode of the four models the blog ran
SECONDS_PER_OP = DEFAULT_GRAPH_S / (GRAPH_OPS["sdxl", "denoiser"] + VAE_OPS)  # about 47 ms


def graph_ops_of(model: str, part: str) -> int:
    """GRAPH_OPS of a model's part (Flux.1-schnell's are Flux.1-dev's)."""
    model = "flux" if get_spec(model).family == "flux" else model
    return GRAPH_OPS.get((model, part), VAE_OPS if part == "vae" else
                         GRAPH_OPS["sdxl", "denoiser"])


def graph_seconds(model: str, part: str) -> float:
    """The estimated default-mode compile of one full-size part ("denoiser" or "vae"): Flux's
    transformer at its published figure, any other graph at SDXL's measured seconds an op."""
    if part == "denoiser" and get_spec(model).family == "flux":
        return FLUX_GRAPH_S
    return graph_ops_of(model, part) * SECONDS_PER_OP


def graph_where(model: str) -> str:
    """Where compile_line's estimate for `model` comes from."""
    if get_spec(model).family == "flux":
        return ("FLUX.1-dev's transformer compiled in 67.4 s on an H100, published; its VAE "
                "decode scaled by its size from SDXL's, measured on this project's H200")
    measured = "measured" if model == "sdxl" else "scaled by the graphs' sizes from SDXL's"
    return (f"{measured}: SDXL's UNet and VAE decode compiled in 110.8 s on this project's "
            "H200 with torch 2.11")


ENV = "FASTDIFF_AUTOTUNE"


def set_autotune(on: bool | None) -> None:
    """Switch autotuning on (True) or off (False) for this process's compiles on a GPU; None
    goes back to the environment (FASTDIFF_AUTOTUNE=1 means on). Off, the default: a compile
    that would tune runs its default-mode equivalent and says what it skipped.
    Introduced in 13_autotuning.ipynb."""
    if on is None:
        STATE.switch.clear()
    elif isinstance(on, bool):
        STATE.switch["on"] = on
    else:
        raise RecipeError(f"set_autotune({on!r}): give True, False or None.")


def autotune_enabled() -> bool:
    """Whether the learner asked for autotuning (set_autotune, else FASTDIFF_AUTOTUNE).
    Introduced in 13_autotuning.ipynb."""
    if "on" in STATE.switch:
        return STATE.switch["on"]
    return checks.env_switch(ENV, "autotuning")


def tunes(mode: str | None, inductor_flags: bool) -> bool:
    """Whether a compile with this mode and the blog's flags tunes on a GPU."""
    return mode in WITHOUT_TUNING or bool(mode and inductor_flags)


# --- what a finished compile leaves covered ------------------------------------------------

def covers(model: str, weights: str, recipe: Recipe | dict | None,
           parts: tuple[str, ...] | None = None) -> list[str]:
    """The coverage keys a finished compile of `recipe` leaves in a tuning bundle (what a
    TuningWatch step records): none when the recipe tunes nothing (or is unknown: None).
    `parts`: the parts that compiled (default: the denoiser, and the VAE decode when
    compile_vae)."""
    if recipe is None:
        return []
    if isinstance(recipe, dict):
        try:
            recipe = Recipe.from_dict(recipe)
        except (RecipeError, TypeError):  # a callable filter, recorded by name: not a bundle's
            return []
    if not tunes(recipe.compile, recipe.inductor_flags):
        return []
    parts = parts or ("denoiser",) + (("vae",) if recipe.compile_vae else ())
    return [coverage_key(model, weights, recipe.to_dict(), part) for part in parts]


# the starts of the notes of a compile the rule changed, and of one that read tuning of another
# GPU kind (measure/record.py keeps the same two to flag its Result; tests tie them)
AUTOTUNE_OFF = "autotuning is off:"
TUNED_ON = "tuned on the "


# --- the decision --------------------------------------------------------------------------

def _gpu(device: str) -> tuple[str, int] | None:
    """(name, SM count) of a CUDA device, None off CUDA."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.device(device))
    return props.name, props.multi_processor_count


def tuning_estimate(pipe_or_model: Any, compile_vae: bool = True, sms: int = PROFILES["h100"].sms
                    ) -> dict[str, Any]:
    """What max-autotune would tune for a pipeline (or a model key: its full-size architecture)
    on a GPU with `sms` SMs (default: an H100's or H200's 132): its GEMM/convolution shapes
    (fdh.course.gemm_shapes; none on a GPU under 68 SMs, which has no templates), their estimated
    benchmarking seconds at the H200's measured cost a shape (and the range its shapes took),
    and the words that say it. Coordinate descent comes on top and is not measured yet.
    Introduced in 13_autotuning.ipynb."""
    big = sms >= TEMPLATE_SMS
    shapes = gemm_shapes(pipe_or_model, vae=compile_vae) if big else 0
    seconds = shapes * SHAPE_S
    low, high = (shapes * s for s in SHAPE_S_RANGE)
    descent = ("then coordinate descent on each generated Triton kernel (its time not measured "
               "yet)")
    if big:
        words = (f"{shapes} GEMM/convolution shapes to benchmark, about {seconds / 60:.0f} min "
                 f"({low / 60:.0f}-{high / 60:.0f} min; {SHAPES_WHERE}), {descent}")
    else:
        words = (f"no GEMM/convolution templates on {sms} SMs (inductor needs {TEMPLATE_SMS}: "
                 f"torch/_inductor/utils.py is_big_gpu), only {descent.removeprefix('then ')}")
    return {"shapes": shapes, "seconds": seconds, "range_s": (low, high), "big_gpu": big,
            "words": words}


def is_tuning_step(before: Recipe, after: Recipe) -> bool:
    """True for a ladder step that adds tuning and nothing else (the course's "+ autotune")."""
    changed = set(after.changes(before))
    return (bool(changed) and changed <= {"compile", "inductor_flags"}
            and tunes(after.compile, after.inductor_flags)
            and not tunes(before.compile, before.inductor_flags))


def blocked(recipe: Recipe, device: str, model: str, weights: str) -> str | None:
    """Why `recipe` may not tune here (autotuning off and no bundle covers it), or None (it
    tunes nothing here, or it may). What run_ladder says of a "+ autotune" step it does not run."""
    gpu = _gpu(device)
    if gpu is None or not tunes(recipe.compile, recipe.inductor_flags) or autotune_enabled():
        return None
    if covered_by(model, weights, recipe) is not None:
        return None
    return (f"autotuning is off and no tuning bundle of this {gpu[0]} covers {model} with this "
            "recipe: this step is autotuning alone, so it is not run (switch autotuning on with "
            "fdh.course.set_autotune(True), fdh.course.settings(..., autotune=True) or --autotune)")


def step_blocked(previous: Recipe | None, recipe: Recipe, device: str, model: str,
                 weights: str) -> str | None:
    """Why a ladder step is not run here: it is autotuning alone on top of `previous` (the
    ladder's step before) and may not tune on this device (blocked); None otherwise. What
    run_ladder, reference and warm ask before a step."""
    if previous is None or not is_tuning_step(previous, recipe):
        return None
    return blocked(recipe.for_device(device)[0], device, model, weights)


def course_tuning(pipe: Any, mode: str, inductor_flags: bool, compile_vae: bool, scope: str,
                  recipe: Recipe | None = None) -> tuple[str, bool, list[str]]:
    """The course's autotune decision, passed to fdh.apply and fdh.compile_pipeline as their
    `tuning` (fdh.course.settings(...).tuning is this): the rule of this module's docstring
    (gate_compile), said in one line, with what the compile will compile and the estimated
    wait on this GPU; a compile that tunes on CUDA keeps coordinate descent's marks
    (coordesc.py), and is noted where it reads tuning imported from another GPU kind; the
    course's compile cache is the one folder (compile_cache.py, said once). Returns
    the (mode, inductor_flags) to compile and the notes for the pipeline's record."""
    mode, inductor_flags, note = gate_compile(pipe, mode, inductor_flags, compile_vae, recipe)
    tuning = tunes(mode, inductor_flags)
    for said in (note, compile_line(pipe, mode, scope, compile_vae, tuning)):
        if said is not None:
            print(f"fastdiff: {said}")
    notes = [note] if note is not None else []
    if tuning and str(next(get_denoiser(pipe).parameters()).device).startswith("cuda"):
        keep_coordesc_marks()  # coordinate descent runs once per kernel (pytorch#172819)
    use_course_cache()  # one cache folder for the course, said once
    if tuning:
        notes += [f"{TUNED_ON}{seed['gpu_name']}: this compile read tuning imported from "
                  f"another GPU kind of the same design ({seed['source']})"
                  for seed in seeded_from(pipeline_info(pipe).model)]
    return mode, inductor_flags, notes


def gate_compile(pipe: Any, mode: str, inductor_flags: bool, compile_vae: bool,
                 recipe: Recipe | None = None) -> tuple[str, bool, str | None]:
    """The (mode, inductor_flags) a compile of `pipe` runs under the rule of this module's
    docstring, and the line that says why when they change or when the compile tunes.
    `recipe`: the whole recipe being applied (fdh.apply), which is what a bundle covers; a
    compile without one (fdh.compile_pipeline alone) is covered by no bundle."""
    device = str(next(get_denoiser(pipe).parameters()).device)
    gpu = _gpu(device)
    if gpu is None or not tunes(mode, inductor_flags):
        return mode, inductor_flags, None
    name, sms = gpu
    if autotune_enabled():
        return mode, inductor_flags, (f"autotuning is on: compile={mode!r} tunes on this {name}: "
                                      f"{tuning_estimate(pipe, compile_vae, sms)['words']}")
    info = pipeline_info(pipe)
    source = covered_by(info.model, info.weights, recipe) if recipe else None
    if source is not None:
        return mode, inductor_flags, (f"compile={mode!r} reads its tuning from {source} (a "
                                      "bundle of this GPU and torch that covers it)")
    plain = WITHOUT_TUNING.get(mode, mode)
    return plain, False, (
        f"{AUTOTUNE_OFF} ran compile={plain!r} in place of compile={mode!r}"
        + (" and without the blog's inductor flags" if inductor_flags else "")
        + f": fusion and the same CUDA graphs, no tuning (skipped: "
        f"{tuning_estimate(pipe, compile_vae, sms)['words']}). Switch it on with fdh.course.set_autotune(True) "
        "(--autotune), or import a tuning bundle of this GPU (fdh.course.settings does).")




def compile_line(pipe: Any, mode: str, scope: str, compile_vae: bool, tuning: bool) -> str | None:
    """What a compile will compile and an estimate of the wait on this GPU, said before the
    first call starts it (None off CUDA)."""
    gpu = _gpu(str(next(get_denoiser(pipe).parameters()).device))
    if gpu is None:
        return None
    name, sms = gpu
    info = pipeline_info(pipe)
    model = info.model
    what = f"{model}'s {denoiser_name(pipe)}" + (" and VAE decode" if compile_vae else "")
    graphs = 1 + int(compile_vae)
    wait = sum(graph_seconds(model, part) for part in ("denoiser", "vae")[:graphs])
    if scope != "full":  # one compile per kind of block, reused for its repeats
        what += f" ({scope}: its blocks)"
        wait = REGIONAL_S + (graph_seconds(model, "vae") if compile_vae else 0)
    size = " for the full-size model (the tiny one takes seconds)" if info.weights == "tiny" \
        else ""
    line = (f"compiling {what} with mode={mode!r} at the first call; estimated wait on this "
            f"{name}: about {wait:.0f} s for {graphs} graph(s){size} ({graph_where(model)})")
    if tuning:
        line += f", plus the tuning: {tuning_estimate(pipe, compile_vae, sms)['words']}"
    return line


def denoiser_name(pipe) -> str:
    """'UNet' or 'transformer', for the lines that say what compiles."""
    return "UNet" if family_of(pipe) == "unet" else "transformer"
