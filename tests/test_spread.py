"""A busy machine is flagged, not reported as a speed-up (issue 15): one spread measure, the
IQR, in the record, the table, the chart and the playground."""

from __future__ import annotations

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.ladder import format_table
from fastdiff_helpers.record import UNSTEADY_IQR


def result(step, samples):
    import statistics

    return fdh.Result(model="sdxl", weights="tiny", step=step, recipe={}, device_name="cpu",
                      height=64, width=64, steps=30, latency_s=statistics.median(samples),
                      latency_samples=samples)


BUSY = [2.65, 2.57, 3.10, 10.21, 3.99]  # the "+ fused QKV 6.23x" baseline samples
STEADY = [0.50, 0.51, 0.49, 0.50, 0.52]


def test_unsteady_samples_are_flagged_and_steady_ones_are_not():
    busy, steady = result("fp32", BUSY), result("bf16", STEADY)
    assert busy.latency_quartiles_s == (2.65, 3.99)
    assert busy.latency_iqr_s == pytest.approx(1.34) and busy.unsteady
    assert busy.flags == ["unsteady timing (IQR 43% of the median): re-run"]
    assert not steady.unsteady and steady.flags == []
    assert not result("x", [1.0, 9.0]).unsteady  # two samples say nothing about spread
    assert 0.16 < UNSTEADY_IQR < 0.32  # between the quiet and the busy measurements


def test_table_chart_and_playground_say_so():
    rows = [result("fp32", BUSY), result("bf16", STEADY)]
    table = format_table(rows)
    assert "UNSTEADY TIMING (IQR 43% OF THE MEDIAN): RE-RUN" in table.splitlines()[2]
    assert table.splitlines()[3].rstrip().endswith("-")
    ax = fdh.ladder_chart(rows).axes[0]
    assert "whiskers: IQR" in ax.get_ylabel()
    flagged = [t for t in ax.texts if t.get_gid() == "ours-flagged"]
    assert len(flagged) == 1 and "unsteady timing!" in flagged[0].get_text()
    # whiskers span the quartiles, and each label sits on top of its whisker
    whiskers = [c for c in ax.collections if c.get_gid() == "iqr"] or ax.collections
    spans = sorted(tuple(sorted(seg[:, 1])) for c in whiskers for seg in c.get_segments())
    assert spans[-1] == pytest.approx((2.65, 3.99))
    assert flagged[0].get_position()[1] == pytest.approx(3.99)
    assert ax.get_ylim()[1] > 3.99 * 1.3


def test_playground_table_shows_the_flag():
    pytest.importorskip("ipywidgets")
    panel = fdh.playground(weights="tiny")
    busy = result("fp32", BUSY)
    panel.rows = [busy]
    panel.baselines[("sdxl", "tiny", 64, 64, 30)] = busy
    assert "unsteady timing" in panel._table_html()
