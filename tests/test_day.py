"""The day's result (issue 59, item 3): the core lessons keep the rungs of the course's ladder
they measured (fdh.course.keep_rung), and the last core lesson draws them in one chart (fdh.course.day_chart)
that reads what was kept and runs nothing: seconds, speed-up and PSNR against the first rung,
cold start, the blog's ratio beside each, and why a rung is missing. On the tiny model."""

from __future__ import annotations

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course import day as D
from fastdiff_helpers.results.store import Result


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """fp32 and bf16 of the tiny SDXL, benchmarked and kept in a day folder of their own; and
    the tiny SD1.5's "+ SDPA", kept too (another model's rung)."""
    folder = tmp_path_factory.mktemp("day")
    settings = fdh.course.settings("sdxl", smoke=True)
    results = {}
    for name in ("fp32, TF32 off", "bf16"):
        pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False),
                         dict(fdh.course.COURSE_LADDER)[name])
        results[name] = fdh.benchmark(pipe, "a photo", step=name, progress=False,
                                      **settings.bench_kwargs())
        assert D.keep_rung(results[name], folder) == folder / "results.jsonl"
    sd15 = fdh.course.settings("sd15", smoke=True)
    pipe = fdh.apply(fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False),
                     dict(fdh.course.COURSE_LADDER)["+ SDPA"])
    D.keep_rung(fdh.benchmark(pipe, "a photo", step="+ SDPA", progress=False,
                              **sd15.bench_kwargs()), folder)
    return folder, settings, results


def test_the_chart_reads_the_kept_rungs_and_says_which_did_not_run(kept, capsys):
    folder, settings, results = kept
    capsys.readouterr()
    rows = {row["rung"]: row for row in D.day_table(settings, folder)}
    fp32, bf16 = results["fp32, TF32 off"], results["bf16"]
    assert rows["fp32, TF32 off"]["seconds"] == fp32.latency_s
    assert rows["bf16"]["speedup"] == pytest.approx(fp32.latency_s / bf16.latency_s)
    assert rows["bf16"]["cold_start"] == bf16.cold_start_s
    assert rows["fp32, TF32 off"]["quality"]["psnr"] == float("inf")
    # the PSNR read back from the kept PNGs, as bf16's own comparison with the fp32 image
    direct = fdh.compare_images(bf16.image, fp32.image)["psnr"]
    assert 20 < rows["bf16"]["quality"]["psnr"] == pytest.approx(direct, abs=0.5)
    blog = fdh.course.BLOG_A100_SECONDS["sdxl"]
    assert rows["bf16"]["blog_ratio"] == pytest.approx(blog["fp32"] / blog["bf16"])
    assert rows["+ TF32"]["blog_ratio"] is None and rows["+ TF32"]["missing"] == (
        "not run (lesson 02 keeps it)")
    assert rows["+ SDPA"]["missing"] == "not run on sdxl (kept for sd15)"
    assert "+ autotune" not in rows and "+ fp8 dynamic" not in rows  # optional, not kept
    assert list(rows) == [name for name, _ in fdh.course.COURSE_LADDER][:8]


def test_the_chart_prints_its_table_and_draws_every_rung(kept, capsys):
    folder, settings, results = kept
    figure = fdh.course.day_chart(settings, folder)
    out = capsys.readouterr().out
    assert "speed-up and PSNR against fp32, TF32 off" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("bf16"))
    ratio = results["fp32, TF32 off"].latency_s / results["bf16"].latency_s
    assert f"{ratio:.2f}x" in line and "1.59x" in line  # the blog's 7.36 / 4.63
    assert "never image quality" in out  # tiny weights
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[::-1] == [name for name, _ in fdh.course.COURSE_LADDER][:8]
    bars = {label: patch.get_width() for label, patch in
            zip(labels, figure.axes[0].patches)}
    assert bars["bf16"] == results["bf16"].latency_s and bars["+ compile"] == 0


def test_a_later_run_of_a_lesson_replaces_its_rung_and_other_sizes_stay_apart(kept, tmp_path,
                                                                               capsys):
    _, settings, results = kept
    first = results["fp32, TF32 off"]
    again = Result(**{**first.to_dict(), "latency_s": first.latency_s / 2})
    bigger = Result(**{**first.to_dict(), "step": "+ TF32", "height": 128, "width": 128})
    for r in (first, again, bigger):
        D.keep_rung(r, tmp_path)
    rows = {row["rung"]: row for row in D.day_table(settings, tmp_path)}
    assert rows["fp32, TF32 off"]["seconds"] == first.latency_s / 2
    assert rows["+ TF32"]["missing"] == "not run at this size, steps or weights"


def test_only_rungs_of_the_course_ladder_are_kept(kept, tmp_path, capsys):
    _, _, results = kept
    other = Result(**{**results["bf16"].to_dict(), "step": "+ fused QKV (eager)"})
    assert D.keep_rung(other, tmp_path) is None
    assert "not a rung of the course's ladder" in capsys.readouterr().out
    assert not (tmp_path / "results.jsonl").exists()
    with pytest.raises(fdh.FastdiffError, match="fdh.Result"):
        D.keep_rung({"step": "bf16"}, tmp_path)


def test_a_rung_that_ran_otherwise_says_how(kept, tmp_path, capsys):
    _, _, results = kept
    cpu_compile = Result(**{**results["bf16"].to_dict(), "step": "+ compile"})
    cpu_compile.recipe = dict(fdh.course.COURSE_LADDER)["+ compile"].to_dict() | {"compile": "default"}
    D.keep_rung(cpu_compile, tmp_path)
    assert "it ran with compile='default'" in capsys.readouterr().out


def test_the_day_folder_is_beside_the_notebooks_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv(D.DAY_ENV, raising=False)
    assert D.day_folder() == D.Path("out") / "day"
    monkeypatch.setenv(D.DAY_ENV, str(tmp_path))
    assert D.day_folder() == tmp_path
