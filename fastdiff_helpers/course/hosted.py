"""A notebook opened where the course is not installed (Colab, Kaggle, a JupyterHub, any Jupyter):
what every notebook's first cell runs to install fastdiff_helpers there. docs/hosted.md.

The first cell installs the package alone (`%pip install --no-deps`), then runs this file by
its path (runpy), so the standard library is all it imports: the package's own imports (torch,
diffusers) must not load before their install. `prepare()` checks the host and says in one line
what stops the course here (no GPU, a card older than a T4's generation, torch below the floor,
no internet), then returns the arguments of the second `%pip install`: the package's
requirements, with the host's torch, numpy, IPython, Jupyter and widget packages held at their
versions (a constraints file from what is installed, as Kaggle builds its own image).
`finish()` says whether the kernel must restart: only when a module it had imported changed.

The cell itself is tools/opening.py FIRST_CELL; every notebook holds a copy (tests/test_hosted.py
keeps them equal; `.venv/bin/python -m tools.lessons --write` writes them). Introduced in
00_setup.ipynb.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlparse

PACKAGE = "fastdiff_helpers"

# Never changed by the install: torch and what comes with its CUDA build, numpy, and the
# kernel's own packages (Colab: "Upgrading ipython, ipykernel, tornado, prompt-toolkit or pyzmq
# can cause your runtime to repeatedly crash", googlecolab/colabtools#1110).
HELD = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|triton|pytorch-triton.*|nvidia-.*"
                  r"|numpy|ipython|ipykernel|ipywidgets|widgetsnbextension|jupyter.*|notebook"
                  r"|notebook-shim|nbclassic|nbclient|nbformat|nbconvert|tornado|pyzmq|traitlets"
                  r"|prompt-toolkit|comm|google-colab)$")

# The oldest card the course runs on: Volta (7.0). torch's CUDA 12.8 and 13.0 builds start at
# Turing (a T4 is 7.5), so the exact answer for a card is torch.cuda.get_arch_list(), which
# card_problem reads once torch can be imported.
CAPABILITY_FLOOR = (7, 0)

NAMES = {"colab": "Colab", "kaggle": "Kaggle", "jupyter": "Jupyter"}
MENUS = {  # where each host gives what the course needs
    "colab": {"gpu": "Runtime > Change runtime type > T4 GPU",
              "internet": "Colab's runtimes are online: reconnect (Runtime > Disconnect and "
                          "delete runtime) and run this cell again",
              "restart": "Runtime > Restart session"},
    "kaggle": {"gpu": "the editor's Session options > Accelerator > GPU T4 x2",
               "internet": "turn it on in the editor's Session options > Internet (Kaggle asks "
                           "for a phone-verified account first)",
               "restart": "Run > Restart & clear cell outputs"},
    "jupyter": {"gpu": "a machine with an NVIDIA GPU (and torch's CUDA build)",
                "internet": "use a network that reaches the package index, or a wheelhouse "
                            "(docs/offline-gpu.md)",
                "restart": "Kernel > Restart Kernel"},
}

class HostError(SystemExit):
    """What stops the course on this host, said in one line. A SystemExit: IPython prints its
    message alone, without a traceback, and a notebook run stops at the first cell."""

    def __init__(self, message: str) -> None:
        super().__init__(f"fastdiff: {message}")


def host(environ: Mapping[str, str] = os.environ) -> str:
    """"colab", "kaggle" or "jupyter" (any other): Colab sets COLAB_* variables
    (COLAB_RELEASE_TAG, COLAB_GPU), Kaggle KAGGLE_KERNEL_RUN_TYPE."""
    if any(name.startswith("COLAB_") for name in environ):
        return "colab"
    return "kaggle" if "KAGGLE_KERNEL_RUN_TYPE" in environ else "jupyter"


def version_tuple(version: str) -> tuple[int, ...]:
    """"2.10.0+cu128" -> (2, 10, 0): the release numbers, local and pre-release parts dropped."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def requirements(dist: str = PACKAGE) -> list[str]:
    """The installed package's own requirements, without its extras ("pytest>=8; extra ==
    'test'")."""
    return [r for r in metadata.requires(dist) or [] if "extra" not in r.partition(";")[2]]


def torch_floor(reqs: list[str]) -> str | None:
    """The version in `torch>=X` among the package's requirements."""
    for req in reqs:
        found = re.match(r"^torch\s*(?:\(\s*)?>=\s*([\w.]+)", req)
        if found:
            return found.group(1)
    return None


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def gpus(run: Callable = subprocess.run) -> list[tuple[str, tuple[int, int]]] | None:
    """[(name, compute capability)] from nvidia-smi, without importing torch (torch's own
    imports must not load before the install); None where there is no NVIDIA driver."""
    try:
        done = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                   capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    found = []
    for line in done.stdout.strip().splitlines():
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit():
            found.append((name.strip(), (int(major), int(minor or 0))))
    return found


def card_problem(name: str, capability: tuple[int, int], arch_list: list[str] | None = None
                 ) -> str | None:
    """Why the course cannot run on this card, or None. Below CAPABILITY_FLOOR (a P100 is 6.0):
    no tensor cores, and torch's current CUDA builds have no kernels for it. With torch's
    arch list (torch.cuda.get_arch_list()): a card whose sm_XY the build does not carry fails
    at its first CUDA op ("no kernel image is available")."""
    sm = capability[0] * 10 + capability[1]
    if capability < CAPABILITY_FLOOR:
        return (f"the {name} (compute capability {capability[0]}.{capability[1]}) is older than "
                f"the course's oldest card generation ({CAPABILITY_FLOOR[0]}."
                f"{CAPABILITY_FLOOR[1]}): it has no tensor cores, and torch's CUDA 12.8/13 builds "
                "carry no kernels for it. Choose a T4 or newer (Kaggle: Session options > "
                "Accelerator > GPU T4 x2).")
    # sm_XY: kernels for that card; compute_XY: PTX that the driver compiles for XY and newer
    kernels = {int(a[3:]) for a in arch_list or [] if a.startswith("sm_") and a[3:].isdigit()}
    ptx = [int(a[8:]) for a in arch_list or [] if a.startswith("compute_") and a[8:].isdigit()]
    if arch_list and sm not in kernels and not any(x <= sm for x in ptx):
        return (f"this torch build carries no kernels for the {name} (sm_{sm}; it has "
                f"{', '.join(arch_list)}): install a torch build for this card's generation.")
    return None


def online(url: str | None = None, connect: Callable = socket.create_connection) -> bool:
    """Whether the package index answers a TCP connection (PIP_INDEX_URL, else PyPI)."""
    where = urlparse(url or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    try:
        connect((where.hostname or "pypi.org", where.port or 443), timeout=5).close()
        return True
    except OSError:
        return False


def check_host(environ: Mapping[str, str] = os.environ, run: Callable = subprocess.run,
               connect: Callable = socket.create_connection,
               version: Callable[[str], str | None] = installed,
               reqs: list[str] | None = None) -> list[str]:
    """The host's limits, each said in one line before anything slow: raises HostError where
    the course cannot run here (no torch, torch below the floor, a card older than 7.0, no
    internet); returns the lines that only inform (no GPU: the CPU story)."""
    where = host(environ)
    menus = MENUS[where]
    reqs = requirements() if reqs is None else reqs
    torch_version, floor = version("torch"), torch_floor(reqs)
    if torch_version is None:
        raise HostError("this Python has no torch: install the CUDA build of "
                        f"torch>={floor} that matches the driver (pytorch.org), then run this "
                        "cell again. The course never installs torch itself.")
    if floor and version_tuple(torch_version) < version_tuple(floor):
        raise HostError(
            f"torch {torch_version} here is older than the course's floor, torch>={floor} "
            "(torchao's kernels need it). Open the notebook on Colab, or upgrade torch and its "
            f"torchvision yourself (%pip install \"torch>={floor}\" torchvision: several GB), "
            f"restart ({menus['restart']}) and run this cell again. The course never "
            "replaces torch on its own.")
    lines = []
    cards = gpus(run)
    if not cards:
        lines.append(f"no GPU on this {NAMES[where]} runtime: the notebooks run their CPU story "
                     f"(tiny models). For a GPU: {menus['gpu']}, then run this cell again.")
    for name, capability in cards or []:
        problem = card_problem(name, capability)
        if problem:
            raise HostError(problem)
    if not environ.get("PIP_NO_INDEX") and not online(environ.get("PIP_INDEX_URL"), connect):
        raise HostError("no internet: the helpers' requirements come from the package index. "
                        f"{menus['internet'][0].upper()}{menus['internet'][1:]}.")
    return lines


def imported_versions() -> dict[str, str]:
    """{distribution: version} of every module this interpreter has imported."""
    owners = metadata.packages_distributions()
    found = {}
    for module in {name.partition(".")[0] for name in list(sys.modules)}:
        for dist in owners.get(module, []):
            found.setdefault(dist, installed(dist) or "")
    return found


def held_lines(dists=None) -> list[str]:
    """`name==version` of every installed HELD distribution: the constraints file."""
    out = {}
    for dist in dists if dists is not None else metadata.distributions():
        name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "").lower())
        if HELD.match(name):
            out[name] = f"{name}=={dist.version}"
    return [out[name] for name in sorted(out)]


def cache_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """~/.cache/fastdiff (XDG_CACHE_HOME respected): the user's, never the package's folder."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastdiff"


_BEFORE: dict[str, str] = {}  # imported_versions() when prepare() ran


def prepare() -> str:
    """Check the host (check_host), keep what this kernel has imported (for finish), write the
    constraints file, and return the second %pip's arguments (quoted for its shell)."""
    for line in check_host():
        print(f"fastdiff: {line}")
    _BEFORE.clear()
    _BEFORE.update(imported_versions())
    held = held_lines()
    constraints = cache_folder() / "host-constraints.txt"
    constraints.parent.mkdir(parents=True, exist_ok=True)
    constraints.write_text("\n".join(held) + "\n", encoding="utf-8")
    reqs = requirements()
    names = [line.split("==")[0] for line in held]
    named = [n for n in ("torch", "numpy", "ipython", "ipykernel", "ipywidgets") if n in names]
    print(f"fastdiff: installing fastdiff_helpers' {len(reqs)} requirements (a minute or two), "
          f"{', '.join(named)} and {len(names) - len(named)} more of torch's and Jupyter's held "
          f"at the host's versions ({constraints})")
    return " ".join(shlex.quote(a) for a in ["-c", str(constraints), *reqs])


def restart_needed(before: Mapping[str, str], after: Callable[[str], str | None] = installed
                   ) -> list[str]:
    """'name old -> new' for each distribution imported before the install that changed."""
    return [f"{dist} {old} -> {after(dist)}" for dist, old in sorted(before.items())
            if after(dist) != old]


def finish(before: Mapping[str, str] | None = None) -> str:
    """One line: the kernel may go on, or (a HostError) must restart first, with why."""
    changed = restart_needed(_BEFORE if before is None else before)
    menus = MENUS[host()]
    if changed:
        raise HostError(f"restart the kernel now ({menus['restart']}), then run this cell "
                        f"again: {', '.join(changed)} changed after this kernel imported it.")
    line = (f"fastdiff: fastdiff_helpers {installed(PACKAGE)} installed; no restart needed "
            "(nothing this kernel had imported changed).")
    print(line)
    return line
