"""Tuning seeded across GPU kinds of one design (issue 44, item 4): an H200's tuning taken on an
H100 SXM only when asked for by name, only with the same SM count and compute capability, and
said wherever it is used. No GPU here: the stamps of the two machines are written as the two
GPUs would write them (course/compiletime/bundle.py tuning_stamp), around this machine's own
torch, triton and system hash."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import fastdiff_helpers as fdh
from fastdiff_helpers.course.compiletime import bundle as bundle_format, bundle_cache, bundle_io
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.course.planning import autotune, tuning_state
from fastdiff_helpers.course.planning.tuning_state import STATE
from test_tuning import _raw  # the slot's by-hand tarball, as tools/gpu_slot.sh makes it

GEMM = {"mm": {"[key A]": {"highest": {"aten": 1.0, "triton_a": 0.5}}}}
BEST = {"ab/cabc.best_config": {"XBLOCK": 64, "num_warps": 4, "found_by_coordesc": True}}


@pytest.fixture(autouse=True)
def _fresh():
    STATE.reset()
    yield
    STATE.reset()


def stamp(name: str, sms: int, capability=(9, 0)) -> dict:
    here = bundle_format.tuning_stamp()
    return dict(here, gpu_name=name, sm_count=sms, capability=list(capability), cpu=None,
                system_hash=f"hash-of-{name}")


def bundle_of(tmp_path, name: str, sms: int, capability=(9, 0)) -> str:
    content = {"format": bundle_format.FORMAT, "stamp": stamp(name, sms, capability),
               "model": "sdxl", "gemm": GEMM, "local": {}, "best_configs": BEST, "runs": []}
    path = tmp_path / f"{name.replace(' ', '_')}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(content).encode()))
    return str(path)


def as_h100(monkeypatch):
    h100 = stamp("NVIDIA H100 80GB HBM3", 132)
    monkeypatch.setattr(bundle_io, "tuning_stamp", lambda: h100)
    return h100


def test_another_kinds_bundle_is_refused_unless_named(tmp_path, monkeypatch):
    h100 = as_h100(monkeypatch)
    h200 = bundle_of(tmp_path, "NVIDIA H200", 132)
    with pytest.raises(FastdiffError, match="gpu_name: bundle 'NVIDIA H200'"):
        fdh.course.import_tuning(h200, cache_dir=tmp_path / "cache", verbose=False)
    assert not (tmp_path / "cache" / "cache").exists()  # nothing written
    done = fdh.course.import_tuning(h200, cache_dir=tmp_path / "cache", verbose=False,
                             from_kind="NVIDIA H200")
    assert (done["blocks_added"], done["best_configs_added"]) == (1, 1)
    # the timings go into this GPU's own timings file (its system hash), the kernels' configs
    # where inductor looks them up (their keys do not hold the GPU's name)
    gemm, _, best = bundle_cache.read_cache_parts(tmp_path / "cache", h100["system_hash"])
    assert gemm == GEMM and best == BEST
    assert tuning_state.seeded_from("sdxl") == [{"gpu_name": "NVIDIA H200", "source": h200}]
    assert tuning_state.seeded_from("sd15") == []  # another model's bundle seeds nothing of it


@pytest.mark.parametrize("kind, sms, capability, said", [
    ("NVIDIA H100 PCIe", 114, (9, 0), "sm_count: bundle 114, here 132"),
    ("NVIDIA A100-SXM4-80GB", 108, (8, 0), "capability: bundle [8, 0], here [9, 0]"),
])
def test_never_across_sm_counts_or_capabilities(tmp_path, monkeypatch, kind, sms, capability,
                                                said):
    as_h100(monkeypatch)
    other = bundle_of(tmp_path, kind, sms, capability)
    with pytest.raises(FastdiffError, match=said.replace("[", r"\[").replace("]", r"\]")):
        fdh.course.import_tuning(other, cache_dir=tmp_path / "cache", verbose=False, from_kind=kind)
    assert not (tmp_path / "cache" / "cache").exists()


def test_the_named_kind_must_be_the_bundles(tmp_path, monkeypatch):
    as_h100(monkeypatch)
    h200 = bundle_of(tmp_path, "NVIDIA H200", 132)
    with pytest.raises(FastdiffError, match="tuned on 'NVIDIA H200', not 'NVIDIA H100 NVL'"):
        fdh.course.import_tuning(h200, cache_dir=tmp_path / "cache", verbose=False,
                          from_kind="NVIDIA H100 NVL")


def test_what_was_seeded_is_recorded_in_the_next_bundle_and_in_every_result(tmp_path,
                                                                             monkeypatch):
    as_h100(monkeypatch)
    h200 = bundle_of(tmp_path, "NVIDIA H200", 132)
    fdh.course.import_tuning(h200, cache_dir=tmp_path / "cache", verbose=False, from_kind="NVIDIA H200")
    out = tmp_path / "h100-sdxl.json.gz"
    fdh.course.export_tuning(out, model="sdxl", cache_dir=tmp_path / "cache", verbose=False)
    written = json.loads(gzip.decompress(out.read_bytes()))
    assert written["seeded_from"] == [{"gpu_name": "NVIDIA H200", "source": h200}]
    assert written["stamp"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert "seeded from another GPU kind: tuned on the NVIDIA H200" in fdh.course.show_tuning(out)
    note = ("tuned on the NVIDIA H200: this compile read tuning imported from another GPU kind "
            f"of the same design ({h200})")
    result = fdh.Result(model="sdxl", weights="random", step="+ autotune", recipe={},
                        device_name="NVIDIA H100 80GB HBM3", height=1024, width=1024, steps=30,
                        notes=[note])
    assert "tuned on the NVIDIA H200" in result.flags


def test_benchmark_says_tuned_on_the_other_kind_for_a_compile_that_tunes(monkeypatch):
    """What the course's tuning decision notes and benchmark keeps: a compile that reads tuning
    (max-autotune or the blog's flags) says where its tuning came from; one that tunes nothing
    says nothing of it."""
    tuning_state.seed("sd15", "NVIDIA H200", "h200.json.gz")
    recipe = fdh.Recipe(dtype="bf16", attention="sdpa", compile="max-autotune",
                        compile_vae=False)
    pipe = fdh.apply(fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False),
                     recipe, tuning=autotune.course_tuning)  # the course's decision says it
    with torch.compiler.set_stance("force_eager"):  # the records decide, not a compile
        tuned = fdh.benchmark(pipe, steps=1, runs=1, warmup=0, progress=False, max_runs=1)
    assert "tuned on the NVIDIA H200" in tuned.flags
    plain = fdh.apply(fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False),
                      fdh.Recipe(dtype="bf16", attention="sdpa"), tuning=autotune.course_tuning)
    assert not any(f.startswith("tuned on") for f in
                   fdh.benchmark(plain, steps=1, runs=1, warmup=0, progress=False,
                                 max_runs=1).flags)


def raw_of(tmp_path, name: str) -> str:
    """A slot's raw tarball of kind `name`: its timings file named by that kind's system hash,
    with inductor's own system record (the GPU's name, this machine's triton and CUDA)."""
    from torch._inductor.codecache import CacheBase

    system = dict(CacheBase.get_system(), device={"name": name}, hash=f"hash-of-{name}")
    return str(_raw(tmp_path / "sdxl.cache-raw.tgz",
                    {f"./cache/hash-of-{name}": {"system": system, "cache": GEMM},
                     "./ab/cabc.best_config": BEST["ab/cabc.best_config"]}))


def test_a_raw_tarball_of_a_known_kind_seeds_a_gpu_of_the_same_design(tmp_path, monkeypatch):
    raw = raw_of(tmp_path, "NVIDIA H200")
    assert bundle_cache.import_raw(raw, cache_dir=tmp_path / "a",
                                   verbose=False) is None  # not this GPU's
    monkeypatch.setattr(bundle_cache, "_this_gpu", lambda: (132, [9, 0]))
    done = bundle_cache.import_raw(raw, cache_dir=tmp_path / "b", verbose=False,
                                 from_kind="NVIDIA H200")
    assert (done["blocks_added"], done["best_configs_added"]) == (1, 1)
    assert tuning_state.seeded_from("sdxl") == [{"gpu_name": "NVIDIA H200", "source": raw}]
    monkeypatch.setattr(bundle_cache, "_this_gpu", lambda: (114, [9, 0]))  # an H100 PCIe
    with pytest.raises(FastdiffError, match="NVIDIA H200 has 132 SMs"):
        bundle_cache.import_raw(raw, cache_dir=tmp_path / "c", verbose=False,
                              from_kind="NVIDIA H200")
    assert not (tmp_path / "c").exists()


def test_the_cli_takes_another_kind_only_by_name(tmp_path, monkeypatch, capsys):
    from fastdiff_helpers.course.runs.cli import main

    as_h100(monkeypatch)
    h200 = bundle_of(tmp_path, "NVIDIA H200", 132)
    cache = str(tmp_path / "cache")
    assert main(["tuning", "import", h200, "--cache-dir", cache]) == 2
    assert "gpu_name" in capsys.readouterr().err
    assert main(["tuning", "import", h200, "--cache-dir", cache,
                 "--from-kind", "NVIDIA H200"]) == 0
    assert f"imported tuning {h200} (tuned on the NVIDIA H200)" in capsys.readouterr().out
