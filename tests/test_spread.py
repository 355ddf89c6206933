"""A busy machine is flagged, not reported as a speed-up (issue 15): the IQR is the spread the
chart draws; how sure the median is (its order-statistic interval, issue 24) decides the flag,
in the record, the table, the chart and the playground."""

from __future__ import annotations

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.results.tables import format_table
from fastdiff_helpers.measure import record
from fastdiff_helpers.measure.record import median_interval


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
    assert busy.latency_iqr_s == pytest.approx(1.34)
    # 5 runs: the interval of the median is (min, max), 93.75 % (1 - 2 / 2**5)
    assert busy.latency_interval_s == (2.57, 10.21, 0.9375)
    assert busy.latency_uncertainty == pytest.approx((10.21 - 3.10) / 3.10) and busy.unsteady
    assert busy.flags == ["uncertain timing (median +-229%: 2.57-10.2 s, 94% interval of 5 runs)"]
    assert steady.latency_uncertainty == pytest.approx(0.04) and not steady.unsteady
    assert steady.flags == []
    assert result("x", [1.0]).latency_uncertainty is None and not result("x", [1.0]).unsteady
    assert 0.02 <= record.STEADY <= 0.10


def test_median_interval_is_the_exact_order_statistic_interval():
    """Coverage of [x(k), x(n+1-k)] is 1 - 2 P(B <= k-1), B ~ Binomial(n, 1/2): the textbook
    table (n=9: x(2)-x(8), 96.1 %; n=20: x(6)-x(15), 95.9 %)."""
    assert median_interval(list(range(1, 10))) == (2, 8, pytest.approx(0.9609375))
    assert median_interval(list(range(1, 21)))[:2] == (6, 15)
    assert median_interval([5.0, 1.0]) == (1.0, 5.0, 0.5)  # too few runs: min, max


def test_table_chart_and_playground_say_so():
    rows = [result("fp32", BUSY), result("bf16", STEADY)]
    table = format_table(rows)
    assert "UNCERTAIN TIMING (MEDIAN +-229%" in table.splitlines()[2]
    assert "RE-RUN" not in table
    assert table.splitlines()[3].rstrip().endswith("-")
    ax = fdh.ladder_chart(rows).axes[0]
    assert "whiskers: IQR" in ax.get_ylabel()
    flagged = [t for t in ax.texts if t.get_gid() == "ours-flagged"]
    assert len(flagged) == 1 and "uncertain timing!" in flagged[0].get_text()
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
    assert "uncertain timing" in panel._table_html()


def test_until_steady_adds_runs_until_the_median_is_known_then_stops():
    """The loop fdh.benchmark and lora_swap_report time with (timing.until_steady): runs
    calls, then one more at a time while the median's interval is wider than +-STEADY. Nine
    samples of 1 s with one of 2 s settle at the ninth (x(2)..x(8), 96 %: both 1 s)."""
    from fastdiff_helpers.measure.timing import steady_note, until_steady

    script, added = iter([1.0, 2.0] + [1.0] * 20), []
    samples = until_steady(lambda: next(script), runs=3, max_runs=12, before_more=added.append)
    assert samples == [1.0, 2.0] + [1.0] * 7 and len(added) == 6
    assert steady_note(samples, 3, 12).startswith("6 more timed run(s) than runs=3")
    assert until_steady(lambda: 0.5, runs=3, max_runs=12) == [0.5] * 3  # steady at once
    assert steady_note([0.5] * 3, 3, 12) is None
    alternating = iter([1.0, 3.0] * 10)
    capped = until_steady(lambda: next(alternating), runs=2, max_runs=6)
    assert len(capped) == 6 and "still +-" in steady_note(capped, 2, 6)


def test_timings_and_speedups_are_quoted_with_their_uncertainty():
    """A median is printed with its +- (format_table's column, Result.timing_text) and a speed-up
    with the range the two medians' intervals allow (Result.speedup_over), so a table or a
    notebook line never quotes a bare time (issue 35)."""
    busy, steady = result("fp32", BUSY), result("bf16", STEADY)
    table = format_table([busy, steady]).splitlines()
    assert table[0].split()[:3] == ["step", "seconds", "+-"]
    assert table[2].split()[1:3] == ["3.10", "+-229%"] and table[3].split()[1:3] == ["0.500", "+-4%"]
    assert steady.timing_text() == "0.500 s +-4% (median of 5)"
    assert result("x", [1.0]).timing_text() == "1.00 s (one run: no +-)"
    assert result("x", [1.0, 1.0]).timing_text() == ("1.00 s +-0% (median of 2, an "
                                                        "interval of 50% only)")
    # 3.10 / 0.50; the range: 2.57 / 0.52 to 10.21 / 0.49 (each median's (min, max) at 5 runs)
    assert steady.speedup_over(busy) == "6.20x (4.94-20.84x, from the medians' intervals)"
    assert result("x", [1.0]).speedup_over(busy).endswith("(one run on a side: no range)")
