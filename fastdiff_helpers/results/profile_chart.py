"""profile_chart(): fdh.profile's answer as a chart, one bar per profiled pipeline.

Introduced in 16_where_the_time_goes.ipynb. Like the other charts it only reads records (here
fdh.profile's Profile) and builds a Figure without pyplot.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import FastdiffError
from ..measure.profile import KINDS, Profile
from .charts import ChartFigure

__all__ = ["profile_chart"]

_STAGES = ("text_encoding", "denoising", "vae_decode", "other")
_STAGE_COLOURS = ("#9467bd", "#1f77b4", "#2ca02c", "#bbbbbb")
_KIND_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#bcbd22", "#7f7f7f")


def profile_chart(profiles: Profile | Mapping[str, Profile]) -> ChartFigure:
    """Two panels, one bar per profile: the time of one image split by stage (milliseconds,
    without the profiler), and the profiled call split by kind of work (shares, so rungs of
    very different speed compare). `profiles`: one Profile, or {label: Profile} in the order to
    draw (a ladder's rungs).
    Introduced in 16_where_the_time_goes.ipynb."""
    if isinstance(profiles, Profile):
        profiles = {"profiled call": profiles}
    if not isinstance(profiles, Mapping) or not profiles or not all(
            isinstance(p, Profile) for p in profiles.values()):
        raise FastdiffError("profile_chart takes a fdh.profile(...) result or a dict "
                            "{label: result}; got " + type(profiles).__name__ + ".")
    labels = list(profiles)
    fig = ChartFigure(figsize=(11, 0.6 * len(labels) + 2.2))
    stage_ax, kind_ax = fig.subplots(1, 2, sharey=True)
    ys = list(range(len(labels)))[::-1]
    left = [0.0] * len(labels)
    for stage, colour in zip(_STAGES, _STAGE_COLOURS):
        ms = [p.stage_groups()[stage] * 1e3 for p in profiles.values()]
        stage_ax.barh(ys, ms, left=left, color=colour, label=stage.replace("_", " "))
        left = [a + b for a, b in zip(left, ms)]
    stage_ax.set_xlabel("ms per image (no profiler)")
    stage_ax.set_yticks(ys, labels)
    stage_ax.set_title("by stage")
    stage_ax.legend(fontsize=8, loc="lower right")
    left = [0.0] * len(labels)
    for kind, colour in zip(KINDS, _KIND_COLOURS):
        share = [100 * p.kinds.get(kind, 0.0) / p.profiled_wall_s if p.profiled_wall_s else 0.0
                 for p in profiles.values()]
        if not any(share):
            continue
        kind_ax.barh(ys, share, left=left, color=colour, label=kind)
        left = [a + b for a, b in zip(left, share)]
    kind_ax.set_xlabel("% of the profiled call")
    kind_ax.set_xlim(0, 100)
    kind_ax.set_title("by kind of work")
    kind_ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    device = {p.device for p in profiles.values()}
    fig.suptitle(f"Where the time goes ({', '.join(sorted(device))})")
    fig.tight_layout()
    return fig
