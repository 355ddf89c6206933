"""Library messages known to be harmless where the course triggers them, silenced narrowly:
anything else still shows.

Introduced in 00_setup.ipynb. The helpers that may first import diffusers, torchao or the
compiler call quiet_known_noise(). Imports nothing of the package."""

from __future__ import annotations

import logging
import re
import warnings
from typing import Callable

# (logger, message pattern, why it is harmless here)
KNOWN_LOG_NOISE = (
    ("torchao", r"Failed to load .*torchao/_C.*\.so",
     "torchao ships kernels for other GPU architectures and CUDA versions (mxfp8, CUTLASS sm90a); "
     "they fail to load on this machine and the course uses none of them"),
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported",
     "torchao registers its enums for torch.compile the old way; the message is for torchao"),
    ("diffusers.quantizers.torchao.torchao_quantizer", r"Unable to import `torchao` Tensor objects",
     "only matters for loading checkpoints saved already quantized by torchao; the course "
     "quantizes in memory"),
    ("transformers.utils.import_utils", r"requires torchvision \(not installed\)",
     "the pipelines' CLIP image processors (safety checker, IP-Adapter) are never called here"),
)
# (warning message pattern, module pattern, why it is harmless here)
KNOWN_WARNINGS = (
    (r"Dynamo detected a call to a `functools.lru_cache`-wrapped function", r"torch\._dynamo",
     "diffusers calls its cached is_torch_version() inside forward; dynamo traces the function "
     "itself, whose answer never changes in a process"),
    (r"\w+ does not implement _stable_hash_for_caching", r"torch\._(dynamo|functorch)",
     "torchao's int8 tensors miss a hash that only makes AOTAutograd's cache key more stable "
     "across processes; compiling is unaffected"),
)


def _drop(pattern: str) -> Callable[[logging.LogRecord], bool]:
    search = re.compile(pattern).search  # a callable is a filter (logging's Filterer.filter)
    return lambda record: not search(record.getMessage())


_installed: list[tuple[logging.Logger, Callable]] = []


def quiet_known_noise(enabled: bool = True) -> None:
    """Silence the messages listed in KNOWN_LOG_NOISE and KNOWN_WARNINGS (idempotent), or, with
    enabled=False, show them again."""
    if not enabled:
        for logger, drop in _installed:
            logger.removeFilter(drop)
        _installed.clear()
        warnings.filters[:] = [f for f in warnings.filters
                               if not (f[0] == "ignore" and f[1] is not None and any(
                                   f[1].pattern == p for p, _, _ in KNOWN_WARNINGS))]
        return
    if not _installed:
        for name, pattern, _ in KNOWN_LOG_NOISE:
            logger, drop = logging.getLogger(name), _drop(pattern)
            logger.addFilter(drop)
            _installed.append((logger, drop))
    for message, module, _ in KNOWN_WARNINGS:  # re-adding a warnings filter only moves it
        warnings.filterwarnings("ignore", message=message, module=module)
