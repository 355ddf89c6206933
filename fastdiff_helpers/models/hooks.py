"""The core's two hooks, the only ways a layer above (the course's, or yours) hooks into what
the helpers do; neither changes a result (a listener may stop a call by raising), and without
a listener or a rule nothing happens.

- Listeners: `with listening(fn):` calls fn(event, facts) as the helpers work: "load" (a
  pipeline loaded: pipe), "compile" (compile_pipeline about to compile: pipe, mode and the mode
  a CUDA GPU runs, scope, compile_vae, inductor_flags, and the Recipe fdh.apply was asked, or
  None), "trace" / "trace_end" (fdh.graph_breaks tracing the denoiser: pipe), "benchmark" /
  "benchmark_end" (fdh.benchmark's calls: pipe, profile), "warm" (fdh.benchmark's warm-up done,
  before timing: pipe, the compile events of each untimed call). The course clock's recorder
  listens (course/planning/recorder.py, which course settings turns on in the notebooks' smoke
  runs), and so does the reference run's refusal to time a compile that tuned
  (tools/reference/run.py refuse_tuned).
- The weights rule: `auto_weights(rule)` puts a rule before load_pipeline's own for
  weights="auto" (models/pretrained.py choose_weights): rule(spec, path, device) returns
  (weights, why), or None to leave the choice to the helpers. The course's carries what a
  notebook's parameters cell chose to the later notebooks (course/weights.py).

The autotune decision is no hook: fdh.apply and fdh.compile_pipeline take it as an argument
(`tuning=`), which the course's settings give (fdh.course.settings(...).tuning).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

Listener = Callable[[str, dict[str, Any]], None]
LISTENERS: list[Listener] = []
WEIGHTS_RULES: list[Callable[..., tuple[str, str] | None]] = []


def tell(event: str, **facts: Any) -> None:
    """Call every listener with `event` and its facts."""
    for listener in tuple(LISTENERS):
        listener(event, facts)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """Call `listener` with every event the helpers tell, inside the block."""
    LISTENERS.append(listener)
    try:
        yield listener
    finally:
        LISTENERS.remove(listener)


def auto_weights(rule: Callable[..., tuple[str, str] | None] | None) -> None:
    """Put `rule` before the helpers' own for weights="auto" (None: take it away)."""
    WEIGHTS_RULES[:] = [] if rule is None else [rule]
