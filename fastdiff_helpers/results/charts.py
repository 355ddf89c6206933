"""Charts of benchmark results, and of fdh.profile's answer (one bar per profiled pipeline).

Introduced in 01_baseline.ipynb (show_images), 02_precision.ipynb (the charts) and
16_where_the_time_goes.ipynb (profile_chart). Charts only read records (Results, fdh.profile's
Profile); they never run a pipeline. They build ``matplotlib.figure.Figure``
objects directly (no pyplot global state), so they work headless, in scripts and in CI.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from matplotlib.figure import Figure

from .. import checks
from ..errors import FastdiffError
from ..measure.profile import KINDS, Profile
from ..measure.quality import compare_images
from ..measure.record import denoising_label, denoising_text
from .store import Result

__all__ = [
    "Reference", "ChartFigure", "ladder_chart", "memory_chart", "quality_chart",
    "models_chart", "profile_chart",
]

_OURS = "#1f77b4"
_REF = "#bbbbbb"
_FAILED = "#d62728"


class ChartFigure(Figure):
    """A Figure that shows itself in Jupyter even when pyplot was never imported.

    matplotlib's Figure has no ``_repr_png_``; notebooks display one only after pyplot or
    ``%matplotlib inline`` registered a formatter. This adds the PNG repr and nothing else.
    """

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()


@dataclass
class Reference:
    """Published timings to draw beside ours, e.g. the PyTorch blog's A100 ladder.

    ``seconds`` maps a ladder step name (the same names as ``Result.step``) to seconds. No
    notebook builds one: run_ladder draws the blog's A100 row with it.
    """

    name: str
    hardware: str
    source: str
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.hardware}, {self.source})"


def _check(results: Sequence[Result]) -> list[Result]:
    results = list(results)
    if not results:
        raise ValueError("no results to chart; pass the Results from benchmark() or load_results()")
    for r in results:
        if not isinstance(r, Result):
            raise TypeError(f"charts take Result objects, got {type(r).__name__}")
    return results


def _timed(r: Result) -> bool:
    return r.error is None and r.latency_s is not None and r.latency_s > 0


def _speedups(results: Sequence[Result]) -> list[float | None]:
    """Speed-up of each result vs the first successful one (None for failed/untimed)."""
    base = next((r.latency_s for r in results if _timed(r)), None)
    return [base / r.latency_s if _timed(r) else None for r in results]


def _fit(fig: Figure, text: str, fontsize: float = 10.0, vertical: bool = False) -> str:
    """`text` wrapped to the figure's width (height for a vertical label), so that a saved
    PNG, which has no bbox_inches="tight", never cuts it off (the blog's reference label is
    wider than a 3-step chart). About 0.6 em per character."""
    inches = fig.get_figheight() * 0.8 if vertical else fig.get_figwidth() * 0.9
    return textwrap.fill(text, max(20, int(inches * 72 / (0.6 * fontsize))))


def _ticks(fig: Figure, labels: list[str], fontsize: float = 9.0) -> list[str]:
    """Step labels wrapped to the width of their bar and kept to 4 lines, so that a long one
    (the playground labels a run with its whole recipe) never squashes the plot above it."""
    chars = max(8, int(fig.get_figwidth() * 0.85 / max(len(labels), 1) * 72 / (0.6 * fontsize)))
    return [textwrap.fill(label, chars, max_lines=4, placeholder=" ...") for label in labels]


def _new_figure(n_bars: int) -> tuple[Figure, object]:
    fig = ChartFigure(figsize=(min(14.0, max(6.0, 0.8 * n_bars + 2.0)), 4.5), layout="constrained")
    return fig, fig.add_subplot()


def ladder_chart(
    results: Sequence[Result], reference: Reference | None = None, title: str | None = None
) -> Figure:
    """One bar per result (in order): median latency, annotated "X.XX s" and the cumulative
    speed-up "N.NNx" vs the first successful result. Failed results are a hatched empty slot
    labelled "failed". ``reference`` adds published timings as a second bar beside each step.

    Introduced in 02_precision.ipynb.
    """
    results = _check(results)
    first = results[0]
    speedups = _speedups(results)
    fig, ax = _new_figure(len(results) * (2 if reference else 1))
    width = 0.4 if reference else 0.7
    xs = list(range(len(results)))
    centres = [x - width / 2 for x in xs] if reference else xs  # ours left of the reference
    timed = [r.latency_s for r in results if _timed(r)]
    ref_values = [reference.seconds.get(r.step) for r in results] if reference else []
    top = max(timed + [v for v in ref_values if v is not None] + [0.0]) or 1.0
    stub = 0.06 * top

    heights = [r.latency_s if _timed(r) else stub for r in results]
    whiskered = False
    bars = ax.bar(centres, heights, width, color=_OURS,
                  label=f"Measured ({first.device_name})")
    for cx, r, bar, speedup in zip(centres, results, bars, speedups):
        if speedup is None:
            bar.set(fill=False, hatch="//", edgecolor=_FAILED)
            ax.text(cx, stub, "failed" if r.error is not None else "no timing",
                    ha="center", va="bottom", color=_FAILED, fontsize=9, gid="failed")
            continue
        lo, hi = r.latency_quartiles_s
        if hi > lo:  # the interquartile range of the timed samples, the course's spread
            ax.errorbar(cx, r.latency_s, yerr=[[r.latency_s - lo], [hi - r.latency_s]],
                        color="black", capsize=3, linewidth=1, gid="iqr")
            whiskered = True
        flags = "".join(f"\n{flag.split(' (')[0]}!" for flag in r.flags)
        # the label sits above the whisker, never on it
        ax.text(cx, max(hi, r.latency_s), f"{r.latency_s:.2f} s\n{speedup:.2f}x{flags}",
                ha="center", va="bottom", fontsize=9, color="firebrick" if flags else None,
                gid="ours-flagged" if flags else "ours")

    if reference is not None:
        pairs = [(x, v) for x, v in zip(xs, ref_values) if v is not None]
        if not pairs:
            raise ValueError(
                f"reference {reference.name!r} has steps {sorted(reference.seconds)} but the "
                f"results have {[r.step for r in results]}; name the steps the same way"
            )
        ref_base = pairs[0][1]
        ax.bar([x + width / 2 for x, _ in pairs], [v for _, v in pairs], width, color=_REF,
               edgecolor="black", linewidth=0.5, label=_fit(fig, reference.label, 8))
        for x, v in pairs:
            ax.text(x + width / 2, v, f"{v:.2f} s\n{ref_base / v:.2f}x",
                    ha="center", va="bottom", fontsize=8, color="#555555", gid="reference")
        ax.legend(loc="upper right", fontsize=8)

    ax.set_xticks(xs, _ticks(fig, [r.step + denoising_label(r, results) for r in results]), fontsize=9)
    ax.set_ylabel(_fit(fig, "seconds per image (median)" + (
        ", whiskers: IQR of the timed runs" if whiskered else ""), vertical=True))
    tallest = max([r.latency_quartiles_s[1] for r in results if _timed(r)] + [top])
    ax.set_ylim(0, tallest * 1.35)  # room for the labels above the whiskers
    ax.set_title(_fit(fig, title or f"{first.model} ({first.weights} weights) on "
                      f"{first.device_name}: {first.height}x{first.width}, {denoising_text(results) or 'steps per bar'}",
                      12))
    return fig


_MEMORY_KINDS = {"cuda_max_allocated": "CUDA max allocated", "process_peak_rss": "process peak RSS"}


def memory_chart(results: Sequence[Result]) -> Figure:
    """Peak memory in GiB per step; the axis says which kind (CUDA max allocated or peak RSS),
    and on CUDA a dashed outline shows the peak reserved (CUDA-graph pools included).

    Introduced in 02_precision.ipynb.
    """
    results = _check(results)
    fig, ax = _new_figure(len(results))
    xs = list(range(len(results)))
    gib = [r.peak_memory_bytes / 2**30 if r.peak_memory_bytes is not None else 0.0 for r in results]
    reserved = [r.peak_reserved_bytes / 2**30 if r.peak_reserved_bytes is not None else None
                for r in results]
    kinds = sorted({r.peak_memory_kind for r in results if r.peak_memory_kind})
    names = [_MEMORY_KINDS.get(k, k) for k in kinds]
    kind = names[0] if len(names) == 1 else ("mixed: " + ", ".join(names) if names else "unknown kind")
    bars = ax.bar(xs, gib, 0.7, color=_OURS, label=f"peak {kind}")
    if any(v is not None for v in reserved):  # CUDA: reserved (graph pools too) as an outline
        ax.bar(xs, [v or 0.0 for v in reserved], 0.7, color="none", edgecolor="black",
               linestyle="--", label="peak reserved (CUDA caching allocator, graph pools too)")
        ax.legend(loc="upper right", fontsize=8)
    for x, r, bar, value in zip(xs, results, bars, gib):
        if r.peak_memory_bytes is None:
            bar.set(fill=False, hatch="//", edgecolor=_FAILED)
            label = "failed" if r.error is not None else "n/a"
        else:
            label = f"{value:.1f} GiB"
        ax.text(x, value, label, ha="center", va="bottom", fontsize=9)
    ax.set_ylabel(f"peak memory, GiB ({kind})")
    ax.set_xticks(xs, _ticks(fig, [r.step + denoising_label(r, results) for r in results]), fontsize=9)
    top = max(gib + [v for v in reserved if v is not None])
    ax.set_ylim(0, (top or 1.0) * 1.2)
    ax.set_title(_fit(fig, f"{results[0].model} ({results[0].weights} weights) on "
                      f"{results[0].device_name}: peak memory", 12))
    return fig


def quality_chart(results: Sequence[Result]) -> Figure:
    """Speed-up (x) vs PSNR against the baseline (y), one point per step, annotated by name.

    PSNR = inf (bit-identical) is drawn at a capped top value labelled "identical"; NaN
    (a broken image) at 0 dB labelled "NaN output". Introduced in 02_precision.ipynb.
    """
    results = _check(results)
    points = [(r.step, s, float(r.quality["psnr"])) for r, s in zip(results, _speedups(results))
              if s is not None and r.quality and r.quality.get("psnr") is not None]
    if not points:
        raise ValueError("no result has both a latency and quality['psnr']; "
                         "fill result.quality with compare_images(result.image, baseline.image)")
    finite = [p for _, _, p in points if math.isfinite(p)]
    cap = max(finite + [40.0]) + 10.0
    fig = ChartFigure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ys = []
    for i, (step, s, psnr) in enumerate(points):
        if math.isnan(psnr):
            y, label = 0.0, f"{step} (NaN output)"
        elif math.isinf(psnr):
            y, label = cap, f"{step} (identical)"
        else:
            y, label = psnr, step
        ys.append(y)
        # alternate above/below so neighbouring steps (close speed-ups) stay readable
        ax.annotate(label, (s, y), textcoords="offset points", xytext=(4, 5 if i % 2 == 0 else -12),
                    fontsize=8)
    ax.scatter([s for _, s, _ in points], ys, color=_OURS, zorder=3)
    ax.axhline(cap, color="#999999", linestyle=":", linewidth=1)
    ax.set_xlabel(f"speed-up vs {results[0].step}")
    ax.set_ylabel("PSNR vs baseline, dB (higher = closer)")
    ax.set_ylim(-2, cap + 6)
    ax.set_title(f"{results[0].model}: speed vs quality")
    return fig


def models_chart(results_by_model: dict[str, Sequence[Result]]) -> Figure:
    """Grouped bars: for each model, the speed-up of each ladder step vs that model's first step.

    Introduced in 17_all_models.ipynb.
    """
    if not results_by_model:
        raise ValueError("no models to chart; pass {model_name: [Result, ...]}")
    # every model's steps, in the order they first come
    steps = list(dict.fromkeys(r.step for rs in results_by_model.values() for r in _check(rs)))
    n = len(results_by_model)
    width = 0.8 / n
    fig, ax = _new_figure(len(steps) * max(1, n // 2))
    for i, (model, results) in enumerate(results_by_model.items()):
        pairs = [(steps.index(r.step), s) for r, s in zip(results, _speedups(results)) if s is not None]
        xs = [x - 0.4 + width * (i + 0.5) for x, _ in pairs]
        ax.bar(xs, [s for _, s in pairs], width, label=model)
        for x, (_, s) in zip(xs, pairs):
            ax.text(x, s, f"{s:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="#999999", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(steps)), steps, rotation=20, ha="right")
    ax.set_ylabel("speed-up vs the model's first step")
    ax.legend(fontsize=8)
    ax.set_title("Speed-up per step, all models")
    return fig


def show_images(images: dict, reference: Any = None, columns: int = 4,
                size: float = 3.0) -> Figure:
    """Images side by side, titled by their key; with `reference` (an image, or a key of
    `images`) each title also gets its PSNR against it. Introduced in 01_baseline.ipynb."""

    if not isinstance(images, dict) or not images:
        raise ValueError("show_images needs at least one image: pass {title: image}.")
    if checks.whole("columns", columns, 1) and checks.real("size", size) <= 0:
        raise checks.FastdiffError(f"{checks.arg('size', size)}: give inches per image, > 0.")
    ref = images.get(reference, reference) if isinstance(reference, str) else reference
    cols = min(columns, len(images))
    rows = math.ceil(len(images) / cols)
    fig = ChartFigure(figsize=(size * cols, size * rows + 0.4), layout="constrained")
    for i, (title, image) in enumerate(images.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.imshow(image)
        ax.set_axis_off()
        label = str(title)
        if ref is not None and image is not ref:
            q = compare_images(image, ref)
            label += "\nNaN/inf!" if q["nan"] else f"\nPSNR {q['psnr']:.1f} dB"
        ax.set_title(label, fontsize=9)
    return fig


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
