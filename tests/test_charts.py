import math

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course.reference import save_figure
from matplotlib.figure import Figure

from fastdiff_helpers.results.charts import (
    Reference, ladder_chart, memory_chart, models_chart, quality_chart,
)
from fastdiff_helpers.results.store import Result
from fastdiff_helpers.course.planning.published import BLOG_SOURCE

BLOG_SDXL = {"fp32": 7.36, "bf16": 4.63, "sdpa": 3.31, "compile": 2.54, "fuse_qkv": 2.52,
             "int8": 2.43}


def _r(step, latency, error=None, memory=None, psnr=None, model="sdxl", samples=None):
    return Result(model=model, weights="random", step=step, recipe={}, device_name="H100",
                  height=1024, width=1024, steps=30, latency_s=latency,
                  latency_samples=samples if samples is not None else
                  ([latency] * 3 if latency is not None else []),
                  peak_memory_bytes=memory, peak_memory_kind="cuda_max_allocated",
                  quality=None if psnr is None else {"psnr": psnr}, error=error)


def _ladder():
    return [_r("fp32", 8.0, memory=12 * 2**30, psnr=math.inf),
            _r("bf16", 4.0, memory=7 * 2**30, psnr=35.5),
            _r("compile", None, error="OOM"),
            _r("int8", 2.5, memory=int(5.5 * 2**30), psnr=30.0,
               samples=[2.45, 2.5, 2.55])]  # spread for whiskers, +-2 %: steady


def _texts(ax, gid):
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def test_ladder_bars_and_annotations():
    fig = ladder_chart(_ladder())
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = ax.containers[0]
    assert [bars[i].get_height() for i in (0, 1, 3)] == [8.0, 4.0, 2.5]
    assert _texts(ax, "ours") == ["8.00 s\n1.00x", "4.00 s\n2.00x", "2.50 s\n3.20x"]
    assert _texts(ax, "failed") == ["failed"]
    assert bars[2].get_fill() is False and bars[2].get_hatch() == "//"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16", "compile", "int8"]
    assert ax.get_title() == "sdxl (random weights) on H100: 1024x1024, 30 steps"
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ladder_speedup_is_vs_first_successful():
    fig = ladder_chart([_r("fp32", None, error="OOM"), _r("bf16", 6.0), _r("sdpa", 4.0)],
                       title="custom")
    ax = fig.axes[0]
    assert _texts(ax, "ours") == ["6.00 s\n1.00x", "4.00 s\n1.50x"]
    assert ax.get_title() == "custom"


def test_ladder_with_reference():
    ref = Reference(name="Blog", hardware="A100-80GB",
                    source="PyTorch blog 'Accelerating Generative AI Part III'",
                    seconds=BLOG_SDXL)
    results = [_r("fp32", 8.0), _r("bf16", 4.0), _r("custom", 3.0), _r("int8", 2.0)]
    ax = ladder_chart(results, reference=ref).axes[0]
    ours, theirs = ax.containers[0], ax.containers[-1]
    assert [b.get_height() for b in ours] == [8.0, 4.0, 3.0, 2.0]
    assert [b.get_height() for b in theirs] == [7.36, 4.63, 2.43]  # no "custom" in the blog
    # side by side: each reference bar sits right of our bar for the same step
    assert theirs[0].get_x() == pytest.approx(ours[0].get_x() + ours[0].get_width())
    assert theirs[2].get_x() == pytest.approx(ours[3].get_x() + ours[3].get_width())
    assert _texts(ax, "reference") == ["7.36 s\n1.00x", "4.63 s\n1.59x", "2.43 s\n3.03x"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["Measured (H100)",
                      "Blog (A100-80GB, PyTorch blog 'Accelerating Generative AI Part III')"]


def test_ladder_reference_without_common_steps_is_an_error():
    ref = Reference("Blog", "A100", "blog", {"baseline": 1.0})
    with pytest.raises(ValueError, match="name the steps the same way"):
        ladder_chart([_r("fp32", 1.0)], reference=ref)


def test_empty_results_rejected():
    with pytest.raises(ValueError, match="no results"):
        ladder_chart([])


def test_memory_chart():
    ax = memory_chart(_ladder()).axes[0]
    heights = [b.get_height() for b in ax.containers[0]]
    assert heights == [12.0, 7.0, 0.0, 5.5]
    assert "CUDA max allocated" in ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["12.0 GiB", "7.0 GiB", "failed", "5.5 GiB"]
    rss = _r("x", 1.0, memory=2**30)
    rss.peak_memory_kind = "process_peak_rss"
    assert "process peak RSS" in memory_chart([rss]).axes[0].get_ylabel()


def test_memory_chart_outlines_the_peak_reserved_with_a_legend():
    """On CUDA the peak reserved is a dashed outline, and the legend names both kinds; without
    it (a CPU's RSS) there is no outline and no legend."""
    results = _ladder()
    for r, reserved in zip(results, (14, 8, None, 6)):
        r.peak_reserved_bytes = None if reserved is None else reserved * 2**30
    ax = memory_chart(results).axes[0]
    assert [b.get_height() for b in ax.containers[1]] == [14.0, 8.0, 0.0, 6.0]
    assert ax.containers[1][0].get_linestyle() == "--"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "peak CUDA max allocated", "peak reserved (CUDA caching allocator, graph pools too)"]
    assert ax.get_ylim()[1] == pytest.approx(14.0 * 1.2)
    assert memory_chart(_ladder()).axes[0].get_legend() is None


def test_quality_chart():
    ax = quality_chart(_ladder()).axes[0]
    points = ax.collections[0].get_offsets()
    cap = max(35.5, 30.0, 40.0) + 10.0  # finite PSNRs (floor 40) + 10 dB
    assert [tuple(p) for p in points] == [(1.0, cap), (2.0, 35.5), (3.2, 30.0)]
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["fp32 (identical)", "bf16", "int8"]


def test_quality_chart_nan_and_missing():
    rs = [_r("fp32", 2.0, psnr=math.inf), _r("fp16", 1.0, psnr=math.nan)]
    ax = quality_chart(rs).axes[0]
    assert [tuple(p) for p in ax.collections[0].get_offsets()] == [(1.0, 50.0), (2.0, 0.0)]
    assert ax.texts[1].get_text() == "fp16 (NaN output)"
    with pytest.raises(ValueError, match="compare_images"):
        quality_chart([_r("fp32", 1.0)])


def test_models_chart():
    data = {"sdxl": [_r("fp32", 8.0), _r("bf16", 4.0), _r("compile", 2.0)],
            "sd15": [_r("fp32", 1.5, model="sd15"), _r("bf16", None, error="x", model="sd15"),
                     _r("compile", 0.5, model="sd15")]}
    ax = models_chart(data).axes[0]
    sdxl, sd15 = ax.containers
    assert [b.get_height() for b in sdxl] == [1.0, 2.0, 4.0]
    assert [b.get_height() for b in sd15] == pytest.approx([1.0, 3.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sdxl", "sd15"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16", "compile"]
    # sd15's compile bar is in the "compile" group, right of sdxl's
    assert sd15[1].get_x() > sdxl[2].get_x()


def test_save_figure(tmp_path):
    path = save_figure(ladder_chart(_ladder()), tmp_path / "charts" / "ladder.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image
    with Image.open(path) as im:
        width, height = im.size
    fig = ladder_chart(_ladder())
    w_in, h_in = fig.get_size_inches()
    assert (width, height) == (round(w_in * 120), round(h_in * 120))


def test_show_images_titles_carry_psnr_against_the_reference():
    import numpy as np
    from fastdiff_helpers.results.charts import show_images
    a = np.zeros((8, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 0, 0] = 255  # one channel of one pixel fully off: MSE = 1/192 -> PSNR 22.83 dB
    fig = show_images({"fp32": a, "bf16": b}, reference="fp32")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == "fp32"
    assert titles[1] == "bf16\nPSNR 22.8 dB"


@pytest.mark.parametrize("chart", ["ladder", "memory"])
def test_saved_chart_keeps_every_label_inside_the_figure(chart):
    # The first H100 run's ladder.png (3 steps beside the blog's A100 bars) had its title and
    # legend cut off on both sides: save_figure writes the figure as it is, unlike a notebook.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    import fastdiff_helpers as fdh

    results = [_r(s, t) for s, t in (("fp32", 3.79), ("bf16", 3.01), ("+ SDPA", 2.30))]
    for r in results:
        r.device_name = "NVIDIA H100 80GB HBM3"
    reference = Reference("Published", "A100-80GB", BLOG_SOURCE, fdh.course.BLOG_A100_SECONDS["sdxl"])
    fig = (ladder_chart(results, reference=reference) if chart == "ladder"
           else memory_chart([_r(s, 1.0, memory=2**30) for s in ("fp32", "bf16")]))
    FigureCanvasAgg(fig).draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    ax = fig.axes[0]
    artists = [ax.title, ax.yaxis.label, *(ax.get_xticklabels())]
    artists += [ax.get_legend()] if ax.get_legend() is not None else []
    for artist in artists:
        extent = artist.get_window_extent(renderer)
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, artist
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, artist


def test_a_long_recipe_label_does_not_squash_the_chart():
    """Issue 24: the playground labels a run with its whole recipe; rotated on one line it took
    most of the figure's height and squashed the bars. Wrapped to its bar, 4 lines at most."""
    from fastdiff_helpers.results.playground import describe_recipe

    long = describe_recipe(fdh.Recipe(dtype="bf16", attention="sdpa", compile="max-autotune",
                                      fullgraph=True, inductor_flags=True, channels_last=True,
                                      fuse_qkv=True, quantize="int8-dynamic",
                                      quant_filter="fastdiff", conv1x1_to_linear="all"))
    assert len(long) > 150
    fig = ladder_chart([_r("fp32", 8.0), _r(long, 2.0)])
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_position().height > 0.5  # the plot keeps most of the figure
    label = ax.get_xticklabels()[1].get_text()
    assert label.count("\n") <= 3 and label.endswith("...")
