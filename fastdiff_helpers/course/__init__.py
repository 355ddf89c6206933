"""course: the course layer, what serves the notebooks. The package without it is the core a
participant takes home; the core imports nothing from here.

    parameters        the parameters cell (smoke mode, fdh.course.settings), GPU-only cells
    reference         the reference numbers a notebook quotes (the blog's row, every ladder
                      under results/, each rung's TF32 and VAE); a run's results folder written
    day               the day's result: the rungs the core lessons kept (fdh.course.keep_rung) and
                      one chart of them at the end of the last (fdh.course.day_chart)
    weights           the weights a parameters cell chose on a GPU, carried to later notebooks;
                      what weights="auto" picks (fdh.course.choose_weights)
    written_for       the library versions the course's code was written for
    hosted            what every notebook's first cell runs where the course is not installed
                      (Colab, Kaggle, any Jupyter): the host's limits, the install with the
                      host's torch and Jupyter held, whether to restart (the cell: tools/)
    savers_report     a lesson's comparison: each memory saver's peak memory and time, beside
                      the pipeline without it (fdh.course.memory_savers_report)
    lora_swaps        14's LoRA lesson: its stand-in LoRA files, made in code
                      (fdh.course.make_lora_file), and what switching LoRAs on a compiled
                      pipeline recompiles and re-records (fdh.course.lora_swap_report)
    cache_hooks       a lesson's comparison: diffusers' cache hooks (FirstBlockCache,
                      TaylorSeer) against the course's step cache on Flux: what runs, host
                      reads, what dynamo compiles (fdh.course.cache_hooks_report)
    recompiles        05's lesson: what a compiled pipeline recompiles for when the image
                      size or a weight changes (fdh.course.recompile_report)
    naive             naive_time: the classic timing mistake 01 shows, wrong on purpose

Its three subpackages: planning (what a card will do with the course, before anything runs: the
clock, the estimates, sizing, the course's compile decisions), compiletime (tuning bundles,
cold starts), runs (the long runs and the command line, `python -m fastdiff_helpers`). The
modules above import the core layers, planning and compiletime, nothing of runs.

`fdh.course` is the course layer's one public name: every call that runs the course rather than
a technique a participant takes home (the parameters cell, the ladders, the reference numbers
and the published figures they quote, the day's chart, the comparisons a lesson makes, the
long runs, the clock's estimates, whether a compile may tune and where its kernels go, cold
starts and tuning bundles) is
`fdh.course.<name>`, loaded on first use from its module below (_API; a module __getattr__,
PEP 562), so `import fastdiff_helpers` and `fdh.course` run none of it.
"""

import importlib

# The course layer's public names by the module (under fastdiff_helpers) that defines each, under
# the same name there; `settings` alone is another name for its function (course_settings, the
# parameters cell's call).
_HOMES = {
    "course.parameters": ("CourseSettings", "needs_gpu", "smoke_mode"),
    "course.reference": ("reference_numbers", "reference_rate", "reference_result",
                         "reference_results"),
    "course.day": ("day_chart", "keep_rung"),
    "course.naive": ("naive_time",),
    # what weights="auto" picks here, and why (models/pretrained.py: load_pipeline's own rule)
    "course.weights": ("choose_weights",),
    "course.savers_report": ("memory_savers_report",),
    "course.lora_swaps": ("lora_swap_report", "make_lora_file"),
    "course.cache_hooks": ("cache_hooks_report",),
    "course.recompiles": ("recompile_report",),
    "course.runs.batch": ("run_batch",),
    "course.runs.ladder": ("run_ladder",),
    "course.runs.warm": ("warm_ladder",),
    "course.runs.launch": ("format_summary", "launch_batch"),
    "course.planning.ladders": ("COURSE_LADDER", "FLUX_LADDER", "LADDER", "LADDERS"),
    "course.planning.image_time": ("image_basis", "image_seconds"),
    "course.planning.plan": ("plan_table",),
    "course.planning.published": ("BLOG_A100_SECONDS", "BLOG_A100_WHERE", "BLOG_LOADING",
                                  "FLUX_COMPILE_SECONDS", "FLUX_H100_BEST", "FLUX_H100_SECONDS",
                                  "PUBLISHED_PARAMETERS"),
    "course.planning.sizing": ("CARDS",),
    # a card, and a model's estimated peak on it (models/fit.py: the core's load refusal reads it)
    "course.planning.gpus": ("gpu_profile", "peak_bytes"),
    "course.planning.shapes": ("gemm_shapes",),
    "course.planning.autotune": ("autotune_enabled", "set_autotune", "tuning_estimate"),
    "course.planning.compile_cache": ("use_course_cache",),
    "course.compiletime.cold_start": ("first_image_in_new_process", "load_artifacts",
                                      "save_artifacts"),
    "course.compiletime.bundle": ("bundle_path", "tuning_stamp"),
    "course.compiletime.bundle_io": ("export_tuning", "import_tuning", "show_tuning"),
    "course.compiletime.tuning_cpu": ("cpu_tuning_run",),
    "course.compiletime.watch": ("TuningWatch",),
}
# Each name with (its module, its name there)
_API = {"settings": ("course.parameters", "course_settings"),
        **{name: (module, name) for module, names in _HOMES.items() for name in names}}

__all__ = sorted(_API)


def __getattr__(name: str):
    """A course-layer name, imported from its module on first use and kept here after."""
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(f"fastdiff_helpers.{module}"), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
