"""The library versions the course's code was written for, said in every notebook's parameters
cell: code copied from a page takes the spellings of these versions (diffusers 0.42 takes
`from_pretrained(..., dtype=...)`, where releases before July 2026 take only `torch_dtype=`).

Introduced in 00_setup.ipynb (the parameters cell's line).
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["WRITTEN_FOR", "written_for_line"]

# The pins of requirements.txt for the libraries a notebook's code calls (tests/test_env.py keeps
# them equal): the versions every cell was run with in CI.
WRITTEN_FOR = {"torch": "2.13.0", "diffusers": "0.42.1", "torchao": "0.18.0",
               "transformers": "5.23.0", "accelerate": "1.15.0", "peft": "0.21.2"}


def written_for_line(installed: dict[str, str] | None = None) -> str:
    """One line: the versions the course's code was written for, and those of this machine
    that differ (`installed`: name -> version; default: this interpreter's)."""
    if installed is None:
        installed = {}
        for name in WRITTEN_FOR:
            try:
                installed[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                installed[name] = "not installed"
    line = ("fastdiff: the code on these pages was written for "
            + ", ".join(f"{name} {version}" for name, version in WRITTEN_FOR.items()))
    differ = [f"{name} {installed[name]}" for name, version in WRITTEN_FOR.items()
              if installed.get(name, version).split("+")[0] != version]  # 2.13.0+cu130 is 2.13.0
    return line + ("; here: " + ", ".join(differ) if differ else "; this machine has them")
