"""fdh.course.reference_numbers: the "Compare with the reference numbers" cell of the notebooks as one
call. It prints the blog's A100 row with where it was read, and every ladder the project
committed on a GPU (or says there is none), each rung with its TF32 switches and VAE."""

from __future__ import annotations

import re

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.results.store import Result, save_results
from fastdiff_helpers.course.planning.published import BLOG_SOURCE


def _result(step: str, latency: float) -> Result:
    return Result(model="sdxl", weights="pretrained", step=step, recipe={}, device_name="H100",
                  height=1024, width=1024, steps=30, runs=3, latency_s=latency,
                  latency_samples=[latency] * 3, cold_start_s=40.0,
                  peak_memory_bytes=10 * 2**30, peak_memory_kind="cuda_max_allocated")


def test_blog_row_with_its_source_and_none_committed(tmp_path, capsys):
    fdh.course.reference_numbers("sdxl", root=tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Published ({BLOG_SOURCE}), sdxl:"
    assert lines[1] == ("  fp32: 7.36 s, bf16: 4.63 s, + SDPA: 3.31 s, + compile: 2.54 s, "
                        "+ fused QKV: 2.52 s, + int8 dynamic: 2.43 s")
    assert lines[2] == f"  read from: {fdh.course.BLOG_A100_WHERE['sdxl']}"
    assert lines[3] == ("No GPU reference results for sdxl are committed yet "
                        "(results/<gpu>/sdxl/results.jsonl).")
    assert len(lines) == 4


@pytest.mark.parametrize("model", sorted(fdh.course.BLOG_A100_SECONDS))
def test_every_models_row_is_printed_in_full(model, tmp_path, capsys):
    fdh.course.reference_numbers(model, root=tmp_path)
    out = capsys.readouterr().out
    printed = dict((step, float(s)) for step, s in
                   re.findall(r"(fp32|bf16|\+ [\w ]+?): ([\d.]+) s", out.splitlines()[1]))
    assert printed == fdh.course.BLOG_A100_SECONDS[model]
    assert fdh.course.BLOG_A100_WHERE[model] in out


def test_steps_keeps_only_those(tmp_path, capsys):
    fdh.course.reference_numbers("sd15", steps=["+ compile", "+ int8 dynamic"], root=tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  + compile: 0.5 s, + int8 dynamic: 0.525 s"
    fdh.course.reference_numbers("sd15", steps="bf16", root=tmp_path)
    assert capsys.readouterr().out.splitlines()[1] == "  bf16: 1.302 s"


def test_unknown_step_says_which_names_exist(tmp_path):
    with pytest.raises(fdh.FastdiffError, match=r"'\+ SDPA'"):
        fdh.course.reference_numbers("sdxl", steps=["+ sdpa"], root=tmp_path)


def test_committed_results_are_tabled_per_gpu(tmp_path, capsys):
    save_results([_result("fp32", 6.0), _result("bf16", 3.0), _result("+ SDPA", 2.0)],
                 tmp_path / "h100" / "sdxl" / "results.jsonl")
    save_results([_result("fp32", 5.0)], tmp_path / "h200" / "sdxl" / "results.jsonl")
    fdh.course.reference_numbers("sdxl", root=tmp_path)
    out = capsys.readouterr().out
    assert "No GPU reference results" not in out
    h100 = out.split("Measured by this project on h100, the blog's ladder (results/h100/sdxl):"
                     )[1].split("Measured by")[0]
    h200 = out.split("Measured by this project on h200, the blog's ladder (results/h200/sdxl):")[1]
    assert h100.splitlines()[1] == "  H100, pretrained weights, 1024x1024, 30 steps"
    assert "never image quality" not in out  # pretrained weights: PSNR is about the image
    rows = {line.split("  ")[0]: line.split() for line in h100.splitlines()[4:] if line}
    assert rows["bf16"][1:5] == ["3.00", "+-0%", "2.00x", "2.00x"], h100  # three equal runs
    assert rows["+ SDPA"][2:6] == ["2.00", "+-0%", "3.00x", "1.50x"], h100
    assert "5.00" in h200 and "6.00" not in h200

    fdh.course.reference_numbers("sdxl", steps=["bf16", "+ SDPA"], root=tmp_path)
    filtered = capsys.readouterr().out.split("Measured by this project on h100,")[1]
    filtered = filtered.split("Measured by")[0]
    assert "6.00" not in filtered and "vs bf16" in filtered, filtered  # fp32 row left out
    assert re.search(r"^\+ SDPA +2\.00 +\+-0% +1\.50x +1\.50x", filtered, re.M), filtered


def test_random_weights_tables_say_what_their_psnr_can_show(tmp_path, capsys):
    result = _result("fp32", 6.0)
    result.weights = "random"
    save_results([result], tmp_path / "h100" / "sdxl" / "results.jsonl")
    fdh.course.reference_numbers("sdxl", root=tmp_path)
    out = capsys.readouterr().out
    assert "  H100, random weights, 1024x1024, 30 steps\n" in out
    assert "the PSNR column shows how far each step moves the numbers, never image quality" in out


def test_every_committed_ladder_is_shown_with_its_tf32_and_vae(capsys):
    """Issue 59: the course's ladder (results/<gpu>/sdxl-course/) beside the blog's; each rung
    says its TF32 switches, as recorded, so a TF32-on "fp32" is never read as true fp32."""
    fdh.course.reference_numbers("sdxl")
    out = capsys.readouterr().out
    blog = out.split("the blog's ladder (results/h100-80gb-hbm3/sdxl):")[1].split("Measured by")[0]
    course = out.split("the course's ladder (results/h100-80gb-hbm3/sdxl-course):")[1]
    assert "fp32: TF32 on, VAE madebyollin/sdxl-vae-fp16-fix" in blog
    assert "fp32, TF32 off: TF32 off, the pipeline's own VAE; + TF32: TF32 on" in course
    rows = {line[:16].strip(): line.split() for line in course.splitlines() if line[:1] in "f+b"}
    committed = {r.step: r for r in fdh.load_results(
        fdh.course.reference.REFERENCE_ROOT / "h100-80gb-hbm3" / "sdxl-course" / "results.jsonl")}
    assert committed["fp32, TF32 off"].tf32["matmul"] == "ieee"
    assert rows["bf16"][1] == f"{committed['bf16'].latency_s:.2f}"
    speedup = committed["fp32, TF32 off"].latency_s / committed["bf16"].latency_s
    assert rows["bf16"][3] == f"{speedup:.2f}x" and speedup > 4


def test_one_ladder_alone(capsys):
    """ladder="course": the course's committed rungs only, without the blog's published row
    (the core path quotes one ladder); a rung name of another ladder is refused."""
    fdh.course.reference_numbers("sdxl", steps=["fp32, TF32 off", "bf16"], ladder="course")
    out = capsys.readouterr().out
    assert "Published" not in out and "the blog's ladder" not in out
    # one table per GPU that ran the course's ladder (the H100's eager rungs, the H200's slot)
    assert out.count("Measured by this project") == 2 and "+ SDPA" not in out
    assert "(results/h100-80gb-hbm3/sdxl-course)" in out and "(results/h200/sdxl-course)" in out
    with pytest.raises(fdh.FastdiffError, match="rung names"):
        fdh.course.reference_numbers("sdxl", steps=["+ int8, eager"], ladder="course")
    with pytest.raises(fdh.FastdiffError, match="ladders"):
        fdh.course.reference_numbers("sdxl", ladder="flux")


def test_no_course_ladder_committed_says_so(tmp_path, capsys):
    save_results([_result("fp32", 6.0)], tmp_path / "h100" / "sdxl" / "results.jsonl")
    fdh.course.reference_numbers("sdxl", ladder="course", root=tmp_path)
    assert capsys.readouterr().out == ("No GPU reference results of the course's ladder for sdxl "
                                       "are committed yet (results/<gpu>/sdxl-course/"
                                       "results.jsonl).\n")
