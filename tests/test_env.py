import json
import re
import subprocess
import sys
import warnings
from importlib import metadata

import torch

from fastdiff_helpers.measure.env import env_report

KEYS = {
    "python", "platform", "torch", "diffusers", "transformers", "torchao", "accelerate",
    "triton", "device", "gpu_name", "gpu_count", "cuda", "driver", "compute_capability",
    "cpu", "cpu_count", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision",
    "sdpa_flash", "sdpa_mem_efficient", "sdpa_math", "sdpa_cudnn", "timestamp",
}


def test_report_dict():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warnings from the TF32 flags
        report = env_report()
    assert KEYS <= set(report)
    assert report["torch"] == torch.__version__
    assert report["diffusers"] == metadata.version("diffusers")
    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert report["gpu_count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert report["cuda"] == torch.version.cuda
    assert isinstance(report["tf32_matmul"], bool) and isinstance(report["tf32_cudnn"], bool)
    assert report["float32_matmul_precision"] in {"highest", "high", "medium"}
    assert report["sdpa_math"] is torch.backends.cuda.math_sdp_enabled()
    assert report["cpu_count"] >= 1
    assert report["timestamp"].endswith("+00:00")
    json.dumps(report)


def test_report_text_is_aligned():
    text = env_report(as_text=True)
    assert isinstance(text, str)
    assert torch.__version__ in text
    lines = text.splitlines()
    assert len(lines) == len(env_report())  # below_floor is the "floor:" line
    value_columns = {len(re.match(r"\S+:\s+", line).group(0)) for line in lines}
    assert len(value_columns) == 1  # every value starts in the same column
    assert any(line.startswith("torch:") and line.endswith(torch.__version__) for line in lines)


def test_missing_package_and_no_heavy_imports():
    # fresh interpreter: reading versions must not import diffusers/torchao; TF32 toggled via
    # the new fp32_precision API shows up (kept out of this process to leave its flags alone)
    code = (
        "import sys, json, torch\n"
        "from fastdiff_helpers.measure import env\n"
        "before = env.env_report()\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "after = env.env_report()\n"
        "env._PACKAGES = env._PACKAGES + ('surely-not-a-package-xyz',)\n"
        "print(json.dumps({'before': before['tf32_matmul'], 'after': after['tf32_matmul'],\n"
        "  'precision': after['float32_matmul_precision'],\n"
        "  'missing': env.env_report()['surely-not-a-package-xyz'],\n"
        "  'imported': [m for m in ('diffusers', 'torchao', 'transformers') if m in sys.modules]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"before": False, "after": True, "precision": "high",
                   "missing": "not installed", "imported": []}


def test_device_name_is_the_cpu_model_on_a_cpu():
    from fastdiff_helpers.measure.env import device_name, env_report
    assert device_name("cpu") == env_report()["cpu"] != ""


def test_floors_are_pyprojects_lower_bounds():
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from fastdiff_helpers.measure.env import FLOORS, PYTHON_BELOW

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    lower = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        bounds = [s.version for s in req.specifier if s.operator == ">="]
        if req.name in FLOORS:
            lower[req.name] = bounds[0]
    assert lower == {k: v for k, v in FLOORS.items() if k != "python"}
    assert SpecifierSet(project["requires-python"]) == SpecifierSet(
        f">={FLOORS['python']},<{PYTHON_BELOW}")


def test_below_floor_names_each_old_version():
    from fastdiff_helpers.measure.env import below_floor

    assert below_floor({"torch": "2.11.0+cu130", "transformers": "5.17.0", "python": "3.12.3",
                        "huggingface_hub": "1.33.0", "diffusers": "0.42.1"}) == []
    assert below_floor({"torch": "2.10.1+cu128", "transformers": "4.57.1", "python": "3.9.18",
                        "diffusers": "not installed"}) == [
        "python 3.9.18 is below 3.10", "torch 2.10.1+cu128 is below 2.11",
        "transformers 4.57.1 is below 5.17"]
    assert below_floor({"python": "3.14.0"}) == ["python 3.14.0 is above the tested range (< 3.14)"]
    assert below_floor({"python": "3.13.1"}) == []  # Colab's Python since 2026-08-19
    assert below_floor({"torch": "2.11.0a0+git123"}) == []  # a 2.11 pre-release build: its release


def test_env_text_says_whether_anything_is_below_the_floor(monkeypatch):
    import fastdiff_helpers.measure.env as env

    assert "every version at or above fastdiff's floor" in env_report(as_text=True)
    monkeypatch.setattr(env, "_version", lambda p: "4.40.0" if p == "transformers" else
                        metadata.version(p) if p != "triton" else "not installed")
    text = env.env_report(as_text=True)
    assert "floor:" in text and "transformers 4.40.0 is below 5.17" in text
