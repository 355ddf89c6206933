import json
import math

import numpy as np
import pytest

from fastdiff_helpers.results.store import (
    SCHEMA_VERSION, Result, ResultsFormatError, load_results, save_results,
)


def _result(step="bf16", latency=4.63, **kw):
    fields = dict(
        model="sdxl", weights="random", step=step, recipe={"dtype": "bf16", "compile": None},
        device_name="NVIDIA H100 80GB HBM3", height=1024, width=1024, steps=30, guidance=5.0,
        runs=5, warmup=2, latency_s=latency,
        latency_samples=[] if latency is None else
        [latency - 0.01, latency, latency + 0.1 / 3, latency, latency + 0.01],
        cold_start_s=12.34, peak_memory_bytes=int(9.1 * 2**30),
        peak_memory_kind="cuda_max_allocated",
        stages={"text_encoding": 0.012, "denoising": 4.5, "vae_decode": 0.118},
        stage_samples={"denoising": [4.49, 4.5, 4.51]},
        quality={"psnr": 38.123456789, "ssim": 0.987654321, "max_abs": 0.1, "nan": False,
                 "nonfinite_fraction": 0.0},
        env={"torch": "2.13.0", "tf32_matmul": False}, notes=["note, with unicode: é"],
        prompt="an astronaut riding a horse",
    )
    fields.update(kw)
    return Result(**fields)


def test_defaults_and_properties():
    r = Result(model="sd15", weights="tiny", step="custom", recipe={}, device_name="cpu",
               height=64, width=64, steps=2, latency_s=2.0, latency_samples=[1.0, 2.0, 3.0, 10.0])
    assert r.schema_version == SCHEMA_VERSION == 1
    assert r.created_at.endswith("+00:00") and r.created_at[:4].isdigit()
    # inclusive quartiles of [1, 2, 3, 10]: q1 = 1.75, q3 = 4.75
    assert r.latency_iqr_s == pytest.approx(3.0)
    assert r.ok
    assert Result(model="m", weights="w", step="s", recipe={}, device_name="d", height=1,
                  width=1, steps=1, latency_samples=[5.0]).latency_iqr_s == 0.0
    assert not _result(error="CUDA out of memory").ok


def test_summary_line():
    r = _result(latency_samples=[4.62, 4.63, 4.63, 4.64, 4.64])
    assert r.summary() == ("sdxl bf16: 4.63 s (median of 5, +-0%, IQR 0.01 s), "
                           "cold start 12.3 s, peak 9.1 GiB")
    assert _result(error="OOM").summary() == "sdxl bf16: FAILED: OOM"


def test_to_dict_is_json_safe_and_excludes_image():
    r = _result(image=np.zeros((2, 2, 3)))
    d = r.to_dict()
    assert "image" not in d
    json.dumps(d, allow_nan=False)
    assert d["latency_samples"] == r.latency_samples


def test_round_trip_exact(tmp_path):
    rs = [
        _result("fp32", 7.36, quality={"psnr": math.inf, "ssim": 1.0, "max_abs": 0.0,
                                       "nan": False, "nonfinite_fraction": 0.0}),
        _result("bf16", 4.63, image="not stored"),
        _result("compile", None, latency_samples=[], error="torch._dynamo failed: x",
                peak_memory_bytes=None, quality=None, stages={}, cold_start_s=None),
        _result("int8", 0.1 + 0.2, latency_samples=[0.1 + 0.2, 1 / 3, 2 / 3, 1e-7],
                prompt="nan"),
    ]
    path = save_results(rs, tmp_path / "deep" / "dir" / "run.jsonl")
    assert path.exists()
    loaded = load_results(path)
    assert loaded == rs
    assert loaded[0].quality["psnr"] == math.inf
    assert loaded[3].latency_samples[1] == 1 / 3
    assert loaded[3].prompt == "nan"  # strings outside numeric fields stay strings
    assert loaded[1].image is None
    assert '"psnr": "inf"' in path.read_text().splitlines()[0]


def test_nan_quality_round_trips(tmp_path):
    r = _result(quality={"psnr": math.nan, "ssim": math.nan, "max_abs": math.nan,
                         "nan": True, "nonfinite_fraction": 0.25})
    (loaded,) = load_results(save_results([r], tmp_path / "r.jsonl"))
    assert math.isnan(loaded.quality["psnr"]) and loaded.quality["nan"] is True
    assert loaded.quality["nonfinite_fraction"] == 0.25


def test_two_saves_append_in_order(tmp_path):
    path = tmp_path / "run.jsonl"
    save_results([_result("fp32", 7.36), _result("bf16", 4.63)], path)
    save_results(_result("sdpa", 3.31), path)
    loaded = load_results(path)
    assert [r.step for r in loaded] == ["fp32", "bf16", "sdpa"]
    assert [r.latency_s for r in loaded] == [7.36, 4.63, 3.31]
    assert len(path.read_text().splitlines()) == 3


def test_blank_lines_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    line = json.dumps(_result().to_dict())
    path.write_text(f"\n{line}\n\n{line}\n\n")
    assert len(load_results(path)) == 2


def test_malformed_middle_line_names_line_number(tmp_path):
    path = tmp_path / "run.jsonl"
    save_results([_result("a")], path)
    with open(path, "a") as fh:
        fh.write("{not json\n")
    save_results([_result("b")], path)
    with pytest.raises(ResultsFormatError, match=r"run\.jsonl:2: not valid JSON"):
        load_results(path)


def test_invalid_record_names_line_and_problem(tmp_path):
    path = tmp_path / "run.jsonl"
    good = _result().to_dict()
    bad = dict(good)
    del bad["latency_s"]
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ResultsFormatError, match=r":2: .*missing required keys \['latency_s'\]"):
        load_results(path)


def test_truncated_final_line_warns_and_is_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    save_results([_result("a"), _result("b")], path)
    full = json.dumps(_result("c").to_dict(), sort_keys=True)
    with open(path, "a") as fh:
        fh.write(full[: len(full) // 2])  # a write cut by a kill: no newline
    with pytest.warns(UserWarning, match=r":3: skipping an incomplete last record"):
        loaded = load_results(path)
    assert [r.step for r in loaded] == ["a", "b"]
    # appending after a cut write drops the fragment, so the file stays readable
    with pytest.warns(UserWarning, match="dropping an incomplete last record"):
        save_results([_result("d")], path)
    assert [r.step for r in load_results(path)] == ["a", "b", "d"]


def test_valid_final_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(_result("a").to_dict()))  # hand-written, no trailing newline
    assert [r.step for r in load_results(path)] == ["a"]
    save_results([_result("b")], path)
    assert [r.step for r in load_results(path)] == ["a", "b"]


def test_wrong_schema_version_rejected():
    d = _result().to_dict()
    d["schema_version"] = 2
    with pytest.raises(ValueError, match="schema_version 2 is not supported.*schema_version 1"):
        Result.from_dict(d)


def test_wrong_schema_version_in_file(tmp_path):
    d = _result().to_dict()
    d["schema_version"] = 0
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(ResultsFormatError, match=r"old\.jsonl:1: .*schema_version 0"):
        load_results(path)


def test_unknown_key_rejected():
    d = _result().to_dict()
    d["latency_ms"] = 4630
    with pytest.raises(ValueError, match=r"unknown keys \['latency_ms'\]"):
        Result.from_dict(d)
    d = _result().to_dict()
    d["image"] = None
    with pytest.raises(ValueError, match="unknown keys"):
        Result.from_dict(d)


def test_wrong_type_rejected():
    d = _result().to_dict()
    d["height"] = "1024"
    with pytest.raises(ValueError, match="'height' must be int"):
        Result.from_dict(d)


def test_unstorable_value_rejected_before_writing(tmp_path):
    path = tmp_path / "run.jsonl"
    with pytest.raises(TypeError, match=r"Result\.recipe\['dtype'\] holds a object"):
        save_results([_result(), _result(recipe={"dtype": object()})], path)
    assert not path.exists() or path.read_text() == ""


def test_numpy_scalars_are_stored_as_python_numbers(tmp_path):
    r = _result(latency_s=np.float32(0.5), peak_memory_bytes=np.int64(1024))
    (loaded,) = load_results(save_results([r], tmp_path / "r.jsonl"))
    assert loaded.latency_s == 0.5 and type(loaded.latency_s) is float
    assert loaded.peak_memory_bytes == 1024 and type(loaded.peak_memory_bytes) is int


def test_reference_results_finds_committed_gpu_results(tmp_path):
    from fastdiff_helpers.course.reference import reference_results
    from fastdiff_helpers.results.store import Result, save_results
    assert reference_results("sdxl", root=tmp_path) == {}
    r = Result(model="sdxl", weights="random", step="fp32", recipe={}, device_name="H100",
               height=1024, width=1024, steps=30, latency_s=1.0, latency_samples=[1.0])
    save_results([r], tmp_path / "h100" / "sdxl" / "results.jsonl")
    found = reference_results("sdxl", root=tmp_path)
    assert list(found) == ["h100"] and found["h100"] == [r]
    # the default root is results/ of this checkout, where the H100 records are committed
    # (it looked in fastdiff_helpers/results/ once store.py moved there: fdh.course.reference_numbers
    # said "No GPU reference results for sdxl are committed yet")
    committed = reference_results("sdxl")
    assert [r.step for r in committed["h100-80gb-hbm3"]][:3] == ["fp32", "bf16", "+ SDPA"]

