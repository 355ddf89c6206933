import json
import re
import subprocess
import sys
import warnings
from importlib import metadata

import torch

from fastdiff_helpers.env import env_report

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
    assert len(lines) == len(env_report())
    value_columns = {len(re.match(r"\S+:\s+", line).group(0)) for line in lines}
    assert len(value_columns) == 1  # every value starts in the same column
    assert any(line.startswith("torch:") and line.endswith(torch.__version__) for line in lines)


def test_missing_package_and_no_heavy_imports():
    # fresh interpreter: reading versions must not import diffusers/torchao; TF32 toggled via
    # the new fp32_precision API shows up (kept out of this process to leave its flags alone)
    code = (
        "import sys, json, torch\n"
        "from fastdiff_helpers import env\n"
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
    from fastdiff_helpers.env import device_name, env_report
    assert device_name("cpu") == env_report()["cpu"] != ""
