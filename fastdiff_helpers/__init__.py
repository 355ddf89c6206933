"""fastdiff_helpers: the helper package of the fastdiff course.

    import fastdiff_helpers as fdh

Importing is cheap and side-effect free: no downloads, no seeds, no global settings. It loads
the core (models, techniques, measure, results): what a participant takes home, `fdh.<name>`.
The course's own machinery (the parameters cell, the reference numbers, the day's chart, the
clock and planning, tuning bundles and cold starts, the long runs and the command line:
course/, with its planning/, compiletime/ and runs/) is `fdh.course.<name>`, loaded on first use
(__getattr__ below; tests/test_layout.py checks that importing loads none of it).
"""

import importlib

from .errors import FastdiffError
from .models.loading import (call_kwargs, count_parameters, free_memory, generate, get_denoiser,
                             load_pipeline, pipeline_info)
from .models.presets import MODELS
from .models.few_step import FEW_STEP
from .techniques import (apply, capture_denoiser_inputs, compile_pipeline, conv1x1_to_linear,
                         count_syncs, current_recipe, fuse_qkv, graph_breaks, quantize,
                         remove_syncs, set_attention, set_channels_last, set_precision,
                         step_cache, stop_guidance)
from .techniques.schedulers import set_scheduler, use_few_step
from .techniques.step_cache import trace_steps
from .techniques.codegen import to_code
from .techniques.lora import enable_lora_hotswap, load_lora, lora_file_info
from .techniques.memory_savers import apply_memory_saver
from .techniques.recipe import Recipe, RecipeError
from .techniques.quantization import fp8_kernel_ok, select_filter
from .measure.bench import benchmark
from .measure.cudagraphs import cudagraph_report
from .measure.env import env_report
from .measure.memory import peak_memory, weight_bytes, what_fits
from .measure.flops import count_flops, flop_floor_seconds, measure_matmul_tflops
from .measure.quality import compare_images
from .measure.profile import profile
from .results.charts import (ladder_chart, memory_chart, models_chart, profile_chart,
                             quality_chart, show_images)
from .results.playground import playground
from .results.tables import format_table
from .results.store import Result, load_results, save_results

# The course layer is one name, `fdh.course` (course/__init__.py lists what it holds, each loaded
# on its first use), imported on first use by a module __getattr__ (PEP 562): `import
# fastdiff_helpers` runs none of its code.
def __getattr__(name: str):
    """fdh.course, imported on first use and kept here after."""
    if name != "course":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = importlib.import_module(f"{__name__}.course")
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"course"})


# The public API: what the notebooks and docs use (tests/test_api.py checks both ways: every
# public name is listed here, each is called or documented as fdh.<name>, and docs/helpers.md
# has an example of each).
__all__ = [
    "apply", "apply_memory_saver", "benchmark", "call_kwargs",
    "capture_denoiser_inputs", "compare_images", "compile_pipeline",
    "conv1x1_to_linear", "count_flops", "count_parameters", "count_syncs", "course",
    "cudagraph_report", "current_recipe", "enable_lora_hotswap",
    "env_report", "FastdiffError", "FEW_STEP",
    "flop_floor_seconds", "format_table", "fp8_kernel_ok", "free_memory", "fuse_qkv",
    "generate", "get_denoiser", "graph_breaks", "ladder_chart", "load_lora",
    "load_pipeline", "load_results", "lora_file_info", "measure_matmul_tflops", "memory_chart",
    "MODELS", "models_chart", "peak_memory", "pipeline_info", "playground",
    "profile", "profile_chart", "quality_chart", "quantize", "Recipe", "RecipeError",
    "remove_syncs", "Result", "save_results", "select_filter",
    "set_attention", "set_channels_last", "set_precision", "set_scheduler", "show_images",
    "step_cache", "stop_guidance", "to_code", "trace_steps",
    "use_few_step", "weight_bytes", "what_fits"]

__version__ = "0.1.0"
