"""Downloads in the rung's dtype: the files a load asks for, said before, the disk checked; the
bytes from meta models; the download command (huggingface_hub and diffusers patched: no
network)."""

import json
from types import SimpleNamespace

import huggingface_hub
import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning.course_downloads import course_downloads
from fastdiff_helpers.models import downloads, hub, pretrained
from fastdiff_helpers.course.runs.cli import main
from fastdiff_helpers.course.planning.course_downloads import download_bytes

SDXL = {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
        "text_encoder_2": 694_659_840}


def test_download_bytes_are_the_parameters_times_the_files_bytes():
    assert download_bytes("sdxl", "fp32") == 4 * sum(SDXL.values())
    assert download_bytes("sdxl", "bf16") == 2 * sum(SDXL.values())  # its fp16 files
    assert download_bytes("pixart", "bf16") == download_bytes("pixart", "fp32")
    assert download_bytes("flux", "fp32") == download_bytes("flux", "bf16")
    assert round(download_bytes("flux", "bf16") / 1e9, 1) == 33.7
    assert download_bytes("fp16-fix", "fp16") == 4 * 83_653_863


def _online(monkeypatch):
    """conftest.py sets HF_HUB_OFFLINE for the whole run; these tests patch the hub instead."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _hub(monkeypatch, names, size=10**9):
    siblings = [SimpleNamespace(rfilename=n, size=size) for n in names]
    _online(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "model_info",
                        lambda *a, **k: SimpleNamespace(siblings=siblings))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)


SDXL_FILES = ["model_index.json", "unet/diffusion_pytorch_model.safetensors",
              "unet/diffusion_pytorch_model.fp16.safetensors", "unet/model.onnx",
              "vae/diffusion_pytorch_model.safetensors",
              "vae/diffusion_pytorch_model.fp16.safetensors",
              "text_encoder/model.safetensors", "text_encoder/model.fp16.safetensors",
              "text_encoder_2/model.safetensors", "text_encoder_2/model.fp16.safetensors",
              "sd_xl_base_1.0.safetensors"]


class Stop(Exception):
    pass


@pytest.fixture
def asked(monkeypatch):
    import diffusers

    calls = []

    def from_pretrained(cls, *args, **kwargs):
        calls.append(kwargs)
        raise Stop

    for name in ("StableDiffusionXLPipeline", "PixArtAlphaPipeline"):
        monkeypatch.setattr(getattr(diffusers, name), "from_pretrained",
                            classmethod(from_pretrained))
    monkeypatch.setattr(pretrained, "pretrained_status", lambda *a, **k: (True, "reachable", None))
    return calls


@pytest.mark.parametrize("dtype, variant, gb", [("bf16", "fp16", 4.0), ("fp16", "fp16", 4.0),
                                                ("fp32", None, 4.0)])
def test_a_load_asks_for_the_files_of_its_dtype_and_says_the_download(
        monkeypatch, asked, capsys, dtype, variant, gb):
    _hub(monkeypatch, SDXL_FILES)
    with pytest.raises(Stop):
        fdh.load_pipeline("sdxl", weights="pretrained", device="cpu", dtype=dtype,
                          verbose=False)
    assert asked[-1].get("variant") == variant
    out = capsys.readouterr().out
    kind = "fp16" if variant else "fp32"
    assert f"its {kind} files): 4 file(s), {gb:.1f} GB" in out


def test_a_repo_without_fp16_files_is_loaded_from_its_plain_ones(monkeypatch, asked):
    _hub(monkeypatch, ["transformer/diffusion_pytorch_model.safetensors",
                       "text_encoder/model-00001-of-00002.safetensors",
                       "text_encoder/model-00002-of-00002.safetensors",
                       "text_encoder/model.safetensors.index.json",
                       "vae/diffusion_pytorch_model.safetensors"])
    with pytest.raises(Stop):
        fdh.load_pipeline("pixart", weights="pretrained", device="cpu", dtype="bf16")
    assert asked[-1]["variant"] is None  # from_pretrained(variant="fp16") would raise here


def test_a_download_the_disk_cannot_hold_is_refused_before_it_starts(monkeypatch, asked):
    _hub(monkeypatch, SDXL_FILES)
    monkeypatch.setattr(downloads, "free_bytes", lambda folder: 10**9)
    with pytest.raises(fdh.FastdiffError, match="needs 4.0 GB.*1.0 GB free.*HF_HUB_CACHE"):
        fdh.load_pipeline("sdxl", weights="pretrained", device="cpu", dtype="bf16")
    assert asked == []


def test_the_ladder_loads_each_step_in_its_weight_dtype():
    assert [fdh.Recipe(dtype=d).weight_dtype for d in ("fp32", "tf32", "bf16", "fp16")] == \
        ["fp32", "fp32", "bf16", "fp16"]


def _work(benchmarks=(), calls=(), compiles=()):
    return {"loads": [], "compiles": list(compiles), "frames": 0,
            "benchmarks": list(benchmarks), "calls": list(calls)}


def test_course_downloads_reads_the_records_precisions():
    bf16 = json.dumps({"compile": "default", "dtype": "bf16"})
    fp32 = json.dumps({"compile": "default"})
    works = {
        "01_a.ipynb": [("c1", _work(benchmarks=[["sdxl", "fp32", False]]))],
        "02_b.ipynb": [("c1", _work(calls=[["sdxl", "compiled"]],
                                    compiles=[["sdxl", "default", "full", True, False, bf16]]))],
        "03_c.ipynb": [("c1", _work(calls=[["sd15", "compiled"], ["pixart", "half"]],
                                    compiles=[["sd15", "default", "full", True, False, fp32]]))],
    }
    rows = course_downloads(works=works)
    assert [(m, f, n) for m, f, _, n in rows] == [
        ("sdxl", "fp16", ["02_b.ipynb"]), ("sdxl", "fp32", ["01_a.ipynb"]),
        ("sd15", "fp32", ["03_c.ipynb"]), ("pixart", "fp32", ["03_c.ipynb"])]
    assert rows[0][2] == download_bytes("sdxl", "bf16")
    assert [r[0] for r in course_downloads(["02"], works=works)] == ["sdxl"]


def test_download_dry_run_prints_the_table_and_the_gb_before(capsys):
    assert main(["download", "--notebooks", "17", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pixart         fp32     21.8  17" in out
    assert "ssd1b          fp16      4.5  17" in out
    assert "as before: 49.2 GB" in out


def test_download_fetches_only_the_files_of_the_dtypes_needed(monkeypatch, tmp_path, capsys):
    _hub(monkeypatch, [f.replace("text_encoder_2", "safety_checker") for f in SDXL_FILES]
         + ["feature_extractor/preprocessor_config.json", "tokenizer/vocab.json"], size=1)
    index = tmp_path / "model_index.json"
    index.write_text(json.dumps({"_class_name": "X", "unet": ["diffusers", "U"],
                                 "tokenizer": ["transformers", "T"],
                                 "safety_checker": ["x", "S"],
                                 "feature_extractor": ["transformers", "F"]}))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: str(index))
    fetched = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **k: fetched.append((repo, k["allow_patterns"])))
    assert main(["download", "--notebooks", "07", "--models", "sd15"]) == 0
    [(repo, patterns)] = fetched
    assert repo == fdh.MODELS["sd15"].hub_id
    assert "unet/diffusion_pytorch_model.fp16.safetensors" in patterns
    assert "unet/diffusion_pytorch_model.safetensors" not in patterns
    assert "sd_xl_base_1.0.safetensors" not in patterns and "unet/model.onnx" not in patterns
    assert "feature_extractor/*" in patterns and "tokenizer/*" in patterns
    assert not any(p.startswith("safety_checker") for p in patterns)


def test_a_gated_repo_becomes_a_clear_error(monkeypatch, capsys):
    from huggingface_hub.errors import GatedRepoError

    def refuse(*a, **k):
        raise GatedRepoError("403", response=SimpleNamespace(headers={}, status_code=403,
                                                             request=None))

    _online(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "model_info", refuse)
    assert main(["download", "--notebooks", "19", "--models", "flux"]) == 2
    assert "needs access" in capsys.readouterr().err


def test_download_for_a_card_leaves_out_what_does_not_fit_it(capsys):
    """--gpu t4: SDXL's fp32 files are left out (its fp32 cells are skipped there), PixArt's
    fp32 files stay (its repo has no others, and PixArt fits a T4 in fp16)."""
    assert main(["download", "--dry-run", "--gpu", "t4", "--notebooks", "01", "17"]) == 0
    out = capsys.readouterr().out
    assert "left out for Tesla T4: sdxl's fp32 files" in out
    rows = {tuple(line.split()[:2]) for line in out.splitlines() if line[:1].isalpha()}
    assert ("pixart", "fp32") in rows and ("sdxl", "fp32") not in rows
    assert main(["download", "--dry-run", "--notebooks", "01"]) == 0
    assert "sdxl           fp32" in capsys.readouterr().out


@pytest.mark.parametrize("variables, offline", [
    ({"HF_HUB_OFFLINE": "ON"}, "HF_HUB_OFFLINE"), ({"HF_HUB_OFFLINE": "yes"}, "HF_HUB_OFFLINE"),
    ({"HF_HUB_OFFLINE": "0"}, None), ({"TRANSFORMERS_OFFLINE": "1"}, "TRANSFORMERS_OFFLINE"),
    ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, None)])
def test_offline_is_read_as_the_hub_library_reads_it(monkeypatch, variables, offline):
    """huggingface_hub/constants.py: HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE; 1/on/yes/true.
    The variable that made it offline is the one the refusal names."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert hub.offline() == offline
    if offline:
        monkeypatch.setattr(pretrained, "cached", lambda *a: None)  # nothing in the cache
        assert pretrained.pretrained_status(fdh.MODELS["sd15"]) == (
            False, f"{fdh.MODELS['sd15'].hub_id} is not cached and {offline} is set", None)


def test_a_repositorys_file_list_is_asked_once_per_process(monkeypatch):
    asked = []
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: asked.append(k) or
                        SimpleNamespace(siblings=[SimpleNamespace(rfilename="a", size=3)]))
    assert hub.file_sizes("x/y") == hub.file_sizes("x/y") == {"a": 3}
    assert asked == [{"files_metadata": True, "timeout": 10}]


def _no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the hub was asked before the check")

    for name in ("model_info", "snapshot_download", "hf_hub_download"):
        monkeypatch.setattr(huggingface_hub, name, refuse)


def test_offline_mode_is_one_line_before_any_network_call(monkeypatch, capsys):
    """HF_HUB_OFFLINE=1 with nothing cached was a traceback (OfflineModeIsEnabled)."""
    _no_network(monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert main(["download", "--notebooks", "07", "--models", "sd15"]) == 2
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and "offline mode" in err and err.count("\n") == 1
    assert main(["download", "--notebooks", "07", "--models", "sd15", "--dry-run"]) == 0


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_cache_variable_naming_a_file_is_one_line_before_any_network_call(
        monkeypatch, tmp_path, capsys, variable):
    """HF_HUB_CACHE or HF_HOME at a regular file were tracebacks (ConnectError,
    NotADirectoryError) after the network was asked."""
    _no_network(monkeypatch)
    _online(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("")
    home = afile if variable == "HF_HOME" else tmp_path / "home"
    monkeypatch.setenv(variable, str(afile))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE",
                        str(afile / "hub") if variable == "HF_HOME" else str(afile))
    assert main(["download", "--notebooks", "07", "--models", "sd15"]) == 2
    err = capsys.readouterr().err
    assert f"{afile} is a file, not a folder. Point {variable} at a folder" in err
    assert err.count("\n") == 1 and afile.read_text() == ""
