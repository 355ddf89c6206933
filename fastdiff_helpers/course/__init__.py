"""course: what serves the notebooks.

    parameters        the parameters cell (smoke mode, fdh.course.settings), GPU-only cells
    reference         the reference numbers a notebook quotes: the blog's published row and
                      every ladder committed under results/, with each rung's TF32 and VAE
    day               the day's result: the rungs the core lessons kept (fdh.course.keep_rung) and
                      one chart of them at the end of the last (fdh.course.day_chart)
    weights           the weights a parameters cell chose on a GPU, carried to later notebooks
    written_for       the library versions the course's code was written for
    playground        fdh.playground(): the ipywidgets panel to try recipes and compare runs
                      (its controls, phases and small formatters first)
    lessons           the course as a workshop day: each notebook's track, visible words and
                      minutes, the core path (README's syllabus, `lessons --write`)
    lesson_plan       what a lesson waits for on an H100 and a T4, and what it downloads
    hosted            what every notebook's first cell runs where the course is not installed
                      (Colab, Kaggle, any Jupyter): the host's limits, the install with the
                      host's torch and Jupyter held, whether to restart; the cell itself
    opening           how a notebook opens where a participant is: its first cell, the GPU
                      Colab gives it, its Open-in-Colab and Open-in-Kaggle badges
    nbclean           git's clean filter for the notebooks (committed without outputs, which
                      the files keep) and `make lab`'s post-save hook

The course sized for the card (card_fit, rung_verdict) is planning's (planning/sizing.py).
Imports the layers below it (models to results), nothing of runs.

`fdh.course` is the course layer's one public name: every call that runs the course rather than
a technique a participant takes home (the parameters cell, the reference numbers and the
published figures they quote, the day's chart, the long runs, the clock's estimates, whether
a compile may tune and where its kernels go, cold starts and tuning bundles) is
`fdh.course.<name>`, loaded on first use from its module below (_API; a module __getattr__,
PEP 562), so `import fastdiff_helpers` and `fdh.course` run none of it.
"""

import importlib

# Each public name of the course layer, with the module (under fastdiff_helpers) that defines
# it and its name there; `settings` is course_settings, the parameters cell's call.
_API = {
    "settings": ("course.parameters", "course_settings"),
    **{n: ("course.parameters", n) for n in ("CourseSettings", "needs_gpu", "smoke_mode")},
    **{n: ("course.reference", n) for n in ("reference_numbers", "reference_rate",
                                             "reference_result")},
    **{n: ("course.day", n) for n in ("day_chart", "keep_rung")},
    "run_batch": ("runs.batch", "run_batch"), "run_ladder": ("runs.ladder", "run_ladder"),
    "warm_ladder": ("runs.warm", "warm_ladder"),
    **{n: ("runs.launch", n) for n in ("format_summary", "launch_batch")},
    **{n: ("planning.image_time", n) for n in ("image_basis", "image_seconds")},
    "plan_table": ("planning.plan", "plan_table"),
    **{n: ("planning.published", n) for n in ("BLOG_A100_SECONDS", "BLOG_A100_WHERE",
                                               "FLUX_COMPILE_SECONDS", "FLUX_H100_BEST",
                                               "FLUX_H100_SECONDS")},
    **{n: ("planning.autotune", n) for n in ("autotune_enabled", "set_autotune",
                                              "tuning_estimate")},
    "use_course_cache": ("planning.compile_cache", "use_course_cache"),
    **{n: ("compiletime.cold_start", n) for n in ("first_image_in_new_process",
                                                   "load_artifacts", "save_artifacts")},
    **{n: ("compiletime.bundle", n) for n in ("bundle_path", "tuning_stamp")},
    **{n: ("compiletime.bundle_io", n) for n in ("export_tuning", "import_tuning",
                                                  "show_tuning")},
    "cpu_tuning_run": ("compiletime.tuning_cpu", "cpu_tuning_run"),
    "TuningWatch": ("compiletime.watch", "TuningWatch"),
}

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
