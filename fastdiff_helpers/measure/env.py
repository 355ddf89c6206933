"""What a measurement ran on. Introduced in 00_setup.ipynb. Every Result carries env_report(),
because a timing means nothing without the GPU, driver and library versions (and the TF32
setting) behind it. Versions are read from package metadata, so diffusers, torchao and friends
are not imported.
"""

from __future__ import annotations

import os
import platform
import re
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["env_report", "FLOORS", "below_floor", "cpu_name"]

_PACKAGES = ("torch", "diffusers", "transformers", "torchao", "accelerate", "triton",
             "huggingface_hub")

# The oldest versions this package is tested with, equal to pyproject.toml's lower bounds
# (tests/test_env.py keeps them equal): torch 2.11 / transformers 5.17 / huggingface_hub 1.33 /
# Python 3.12 on the H100 image of results/h100-80gb-hbm3/env.txt, the pins of requirements.txt
# on the CPU (Python 3.11). Below them, something this course relies on may be missing.
# peft: diffusers' LoRA loading refuses older ones (MIN_PEFT_VERSION, diffusers/utils/constants.py:24).
FLOORS = {"python": "3.10", "torch": "2.11", "diffusers": "0.42", "transformers": "5.17",
          "torchao": "0.18", "accelerate": "1.15", "peft": "0.17", "huggingface_hub": "1.33",
          "safetensors": "0.8", "tokenizers": "0.23"}
# Python versions run so far: 3.11 (CPU, CI) and 3.12 (GPU). 3.13 (Colab's since 2026-08-19) is
# admitted on static checks (no module imports what 3.13 removed; every requirement has a cp313
# wheel: tests/test_hosted.py); 3.14 and later are not.
PYTHON_BELOW = "3.14"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def below_floor(versions: dict[str, str] | None = None) -> list[str]:
    """What is below fastdiff's floor (FLOORS, pyproject.toml's lower bounds), one line each,
    e.g. "torch 2.10.0 is below 2.11". `versions` maps a name of FLOORS to a version string
    (default: this interpreter's); a package that is not installed is not listed here."""
    from packaging.version import InvalidVersion, Version

    if versions is None:
        versions = {name: platform.python_version() if name == "python" else _version(name)
                    for name in FLOORS}
    found = []
    for name, floor in FLOORS.items():
        have = versions.get(name)
        if have is None or have == "not installed":
            continue
        try:
            version = Version(have)
        except InvalidVersion:
            found.append(f"{name} {have} is not a version this check can read (floor {floor})")
            continue
        if version.release < Version(floor).release:
            found.append(f"{name} {have} is below {floor}")
        elif name == "python" and version.release[:2] >= Version(PYTHON_BELOW).release:
            found.append(f"python {have} is above the tested range (< {PYTHON_BELOW})")
    return found


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _driver_version(torch: Any) -> str | None:
    """The NVIDIA driver version, or None. torch has no getter for it (a CUDA device's properties
    hold none: torch/_C/__init__.pyi, _CudaDeviceProperties), so read the driver's own /proc
    file on Linux (no nvidia-smi needed)."""
    proc = Path("/proc/driver/nvidia/version")
    if not torch.cuda.is_available() or not proc.exists():
        return None
    # "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]  550.54.15  ..."
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\d.]*)", proc.read_text(errors="replace"))
    return match.group(1) if match else None


def _fp32_precision(chain: list[Any]) -> str:
    """Resolve torch's fp32_precision setting ("tf32" or "ieee"), following "none" to the parent."""
    values = (getattr(node, "fp32_precision", "none") for node in chain)
    return next((value for value in values if value != "none"), "ieee")


def _tf32_flags(torch: Any) -> tuple[bool, bool]:
    """(matmul, cudnn conv) TF32 on? torch >= 2.9 has the fp32_precision API; reading the legacy
    allow_tf32 flags after the new API was used raises, so only fall back when it is absent."""
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(backends.cudnn, "conv"):
        matmul = _fp32_precision([backends.cuda.matmul, backends])
        conv = _fp32_precision([backends.cudnn.conv, backends.cudnn, backends])
        return matmul == "tf32", conv == "tf32"
    return bool(backends.cuda.matmul.allow_tf32), bool(backends.cudnn.allow_tf32)


def device_name(device: Any) -> str:
    """The GPU's name for a CUDA device, else the CPU's model name (what results record)."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def env_report(as_text: bool = False) -> dict[str, Any] | str:
    """Versions, device, GPU and numeric flags, as a dict (or an aligned text block).

    Keys: python, platform, torch, diffusers, transformers, torchao, accelerate, triton
    ("not installed" when missing), device ("cuda" or "cpu"), gpu_name, gpu_count,
    gpu_memory_bytes, cuda, driver, compute_capability (None without a GPU), cpu, cpu_count,
    tf32_matmul and tf32_cudnn (bool: is TF32 in use for fp32 matmuls / cuDNN convolutions),
    float32_matmul_precision, sdpa_flash, sdpa_mem_efficient, sdpa_math, sdpa_cudnn (bool:
    backend enabled), timestamp (ISO-8601 UTC), huggingface_hub, below_floor (the lines of
    below_floor(): what is older than the versions fastdiff is tested with).

    Introduced in 00_setup.ipynb.
    """
    import torch

    has_cuda = torch.cuda.is_available()
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    report.update({package: _version(package) for package in _PACKAGES})
    report["torch"] = torch.__version__  # the running build, e.g. "2.13.0+cpu"
    report["device"] = "cuda" if has_cuda else "cpu"
    report["gpu_name"] = torch.cuda.get_device_name(0) if has_cuda else None
    report["gpu_count"] = torch.cuda.device_count() if has_cuda else 0
    report["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory if has_cuda else None
    report["cuda"] = torch.version.cuda
    report["driver"] = _driver_version(torch)
    report["compute_capability"] = (".".join(map(str, torch.cuda.get_device_capability(0)))
                                    if has_cuda else None)
    report["cpu"] = cpu_name()
    report["cpu_count"] = os.cpu_count()
    report["tf32_matmul"], report["tf32_cudnn"] = _tf32_flags(torch)
    try:
        report["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except RuntimeError:
        # torch refuses when legacy and new TF32 APIs were mixed; report what the new API says
        report["float32_matmul_precision"] = "high" if report["tf32_matmul"] else "highest"
    for name in ("flash", "mem_efficient", "math", "cudnn"):
        enabled = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
        report[f"sdpa_{name}"] = bool(enabled()) if enabled is not None else None
    report["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # the report's versions (peft's is not one) and two more
    report["below_floor"] = below_floor({**report, "safetensors": _version("safetensors"),
                                         "tokenizers": _version("tokenizers")})

    if not as_text:
        return report
    width = max(len(k) for k in report) + 1
    lines = [f"{k + ':':<{width}} {v}" for k, v in report.items() if k != "below_floor"]
    below = report["below_floor"]
    lines.append(f"{'floor:':<{width}} " + ("; ".join(below) + " (pip install -U the package, "
                 "or expect a failure: fastdiff is tested from these versions up)" if below else
                 "every version at or above fastdiff's floor "
                 "(fastdiff_helpers.measure.env.FLOORS)"))
    return "\n".join(lines)
