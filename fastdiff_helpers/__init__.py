"""fastdiff_helpers: the helper package of the fastdiff course.

    import fastdiff_helpers as fdh

Importing is cheap and side-effect free: no downloads, no seeds, no global settings.
"""

from .presets import BLOG_A100_SECONDS, MODELS, PUBLISHED_PARAMETERS, ModelSpec
from .loading import (FastdiffError, call_kwargs, count_parameters, generate, load_pipeline,
                      pipeline_info)

__version__ = "0.1.0"
