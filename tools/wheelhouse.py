"""A wheelhouse for a machine that already has its torch: `make wheelhouse HAVE=...`.

    python3 tools/wheelhouse.py --have tools/images/workplace-cuda-2026-11.txt \
        [--python 3.12] [--platform manylinux_2_28_x86_64] [--out wheelhouse] [--no-notebooks]

Downloads exactly the wheels that fastdiff_helpers, `pytest tests/gpu` and headless notebook
runs (nbclient) need and the target lacks, for the target's Python and platform, into
OUT/wheels, with OUT/install.sh (offline install into the running interpreter, or into a folder
plus a .pth file) and OUT/manifest.json. The target's packages come as a `pip freeze` file or a
list ("torch==2.11.0 transformers==5.17.0 ..."; a bare name means "present, any version").
torch, triton and the nvidia-* libraries are never carried: they come with the machine's CUDA
build. A target below fastdiff's floor (pyproject.toml) is refused with the reason, before any
download.

`resolve()` decides which wheels, given what is there; it takes the index as a function, so the
tests run it with no network. The real index is `pip download --no-deps` (PyPI, or whatever pip
is configured with). Needs only the standard library, pip and `packaging` (pip's own copy if
`packaging` is not installed): no torch, no .venv.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections import deque
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Callable, Iterable

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.markers import Marker  # type: ignore  # noqa: F401
    from pip._vendor.packaging.requirements import Requirement  # type: ignore
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore
    from pip._vendor.packaging.version import Version  # type: ignore

ROOT = Path(__file__).resolve().parent.parent
# What `pytest tests/gpu` and an nbclient run of the notebooks need beyond the package itself
# (tests/test_notebooks.py executes with nbclient + ipykernel; the playground needs ipywidgets).
TESTS = ["pytest"]
NOTEBOOKS = ["nbclient", "nbformat", "ipykernel", "ipywidgets"]
# Never carried: the machine's own CUDA build of torch and what comes with it.
NEVER = re.compile(r"^(torch|triton|nvidia-.*|pytorch-triton.*)$")
MANYLINUX = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


class Refusal(Exception):
    """The target cannot be served by a wheelhouse (below the floor, a conflict...)."""


@dataclass
class Wheel:
    name: str  # canonical
    version: str
    filename: str
    size: int
    requires: list[str] = field(default_factory=list)
    needed_by: str = ""
    replaces: str | None = None  # the target's older version this one replaces, if any


Index = Callable[[str, SpecifierSet, "str | None"], Wheel]


def target_env(python: str, platform: str) -> dict[str, str]:
    """The marker environment of the target (PEP 508), for Requires-Dist lines."""
    machine = "x86_64" if "x86_64" in platform else "aarch64" if "aarch64" in platform else ""
    full = python if python.count(".") >= 2 else python + ".0"
    return {"python_version": ".".join(python.split(".")[:2]), "python_full_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": full, "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine, "platform_release": "",
            "platform_version": "", "extra": ""}


def parse_have(text: str) -> dict[str, str | None]:
    """{canonical name: version or None} from `pip freeze` output or a list of `name==version`
    / bare names separated by spaces, commas or newlines. Editable and VCS lines are skipped;
    `name @ URL` counts as present with no version."""
    have: dict[str, str | None] = {}
    items = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):  # -e / --index-url lines name no installed version
            items += re.split(r"[\s,]+", line)
    for item in items:
        if not item:
            continue
        if "==" in item:
            name, version = item.split("==", 1)
            have[canonicalize_name(name)] = version.split(";")[0].strip()
        elif re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", item):
            have.setdefault(canonicalize_name(item), None)
    return have


def read_have(value: str) -> dict[str, str | None]:
    """HAVE= is a file (a pip freeze) if such a file exists, else the list itself."""
    path = Path(value)
    return parse_have(path.read_text() if value and path.is_file() else value)


def project_requirements(root: Path = ROOT) -> tuple[list[str], str]:
    """pyproject.toml's dependencies and requires-python."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]), project["requires-python"]


def pins(root: Path = ROOT) -> dict[str, str]:
    """requirements.txt's exact versions, {canonical name: version}."""
    found = {}
    for line in (root / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[canonicalize_name(name)] = version.strip()
    return found


def check_floor(have: dict[str, str | None], python: str, requirements: Iterable[str],
                requires_python: str) -> None:
    """Refuse a target whose Python or installed packages are below the package's floor."""
    problems = []
    if not SpecifierSet(requires_python).contains(python + ("" if python.count(".") >= 2 else ".0")):
        problems.append(f"Python {python} is outside fastdiff's range {requires_python}")
    for line in requirements:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        version = have.get(name)
        if version is not None and not req.specifier.contains(
                Version(version).base_version, prereleases=True):
            problems.append(f"{name} {version} on the target does not satisfy {req} "
                            "(pyproject.toml)")
    if problems:
        raise Refusal("the target is below fastdiff's floor: " + "; ".join(problems) + ". "
                      "Upgrade those on the machine first (the wheelhouse never replaces "
                      "torch, and replacing the image's other core packages could break it).")


def resolve(roots: Iterable[str], have: dict[str, str | None], index: Index, python: str,
            platform: str = "manylinux_2_28_x86_64",
            pinned: dict[str, str] | None = None) -> list[Wheel]:
    """The wheels to carry, in the order they were found: every requirement reachable from
    `roots` that `have` does not satisfy. Packages the target has (at a version that
    satisfies the requirement, or with no version given) are not carried and their own needs
    are not followed (they are installed there). `pinned` (requirements.txt) decides the
    version where it satisfies the requirement; otherwise the index picks the newest that does.
    No backtracking: a second requirement that the chosen version fails is a Refusal."""
    env = target_env(python, platform)
    pinned = pinned or {}
    queue = deque((Requirement(r), "fastdiff") for r in roots)
    chosen: dict[str, Wheel] = {}
    prefetch = getattr(index, "prefetch", None)
    while queue:
        # one breadth of the walk at a time (the order is a plain queue's): what it will ask
        # the index for is known before the first answer, so an index that can fetch many at
        # once (pip_index: one pip process for all) gets them together first
        wave = list(queue)
        queue.clear()
        if prefetch is not None:
            asked: dict[str, tuple[str, SpecifierSet, str | None]] = {}
            for req, _ in wave:
                name = _lacking(req, have, env)
                if name and not NEVER.match(name) and name not in chosen and name not in asked:
                    asked[name] = (name, req.specifier, _pin(req, name, pinned))
            if asked:
                prefetch(list(asked.values()))
        for req, parent in wave:
            _take(req, parent, have, env, index, pinned, chosen, queue)
    return list(chosen.values())


def _lacking(req: Requirement, have: dict[str, str | None], env: dict[str, str]) -> str | None:
    """The canonical name of a requirement that applies to the target (its marker) and that
    the target does not satisfy; None otherwise."""
    if req.marker is not None and not req.marker.evaluate(env):
        return None
    name = canonicalize_name(req.name)
    version = have.get(name)
    if name in have and (version is None or req.specifier.contains(
            Version(version).base_version, prereleases=True)):
        return None
    return name


def _pin(req: Requirement, name: str, pinned: dict[str, str]) -> str | None:
    """requirements.txt's version of `name`, where it satisfies the requirement."""
    pin = pinned.get(name)
    return pin if pin is not None and req.specifier.contains(pin, prereleases=True) else None


def _take(req: Requirement, parent: str, have: dict[str, str | None], env: dict[str, str],
          index: Index, pinned: dict[str, str], chosen: dict[str, Wheel], queue: deque) -> None:
    """One requirement of the walk: carried (its wheel chosen, its own needs queued), already
    chosen at a version it accepts, not needed, or a Refusal."""
    name = _lacking(req, have, env)
    if name is None:
        return
    present, version = name in have, have.get(name)
    if NEVER.match(name):
        what = f"{name} {version} on the target" if present else f"{name} is not on the target:"
        raise Refusal(f"{what} {'does not satisfy' if present else 'needed as'} {req} "
                      f"(for {parent}). The wheelhouse never carries {name}: install the "
                      "machine's CUDA build of it first.")
    if name in chosen:
        if not req.specifier.contains(chosen[name].version, prereleases=True):
            raise Refusal(f"{name}: {chosen[name].version} was chosen for "
                          f"{chosen[name].needed_by}, but {parent} needs {req}")
        return
    wheel = index(name, req.specifier, _pin(req, name, pinned))
    wheel.needed_by, wheel.replaces = parent, version if present else None
    chosen[name] = wheel
    queue.extend((Requirement(dep), name) for dep in wheel.requires)


# --- the real index: pip download --no-deps -------------------------------------------------

def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) read from a wheel's METADATA."""
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(zf.read(meta).decode("utf-8", "replace"))
    return canonicalize_name(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def pip_index(folder: Path, python: str, platform: str) -> Index:
    """An Index that downloads with `pip download --no-deps` into `folder` (a wheel already
    there for that name and version is reused): one wheel a call, and with its `prefetch`
    (resolve calls it with each breadth of the walk) many in one pip process. Each pip process
    costs about 0.4 s of CPU to start: with one per wheel, `make wheelhouse` for the GPU image
    (37 wheels) took 18.0 s here, 15.1 s of it user CPU; with one per breadth, 4.3 s."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [platform] + [p for p in MANYLINUX if p != platform] if "x86_64" in platform \
        else [platform]
    read: dict[str, tuple[str, str, list[str]]] = {}  # file name -> its metadata, read once

    def download(targets: list[str], into: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--disable-pip-version-check", "--only-binary=:all:", "--implementation", "cp",
               "--python-version", python, "-d", into, *targets]
        for p in platforms:
            cmd[4:4] = ["--platform", p]
        return subprocess.run(cmd, capture_output=True, text=True)

    def there(name: str, spec: SpecifierSet, pin: str | None) -> Wheel | None:
        for existing in folder.glob("*.whl"):
            if existing.name not in read:
                read[existing.name] = wheel_metadata(existing)
            got_name, got_version, requires = read[existing.name]
            if got_name == name and (got_version == pin or (pin is None and spec.contains(
                    got_version, prereleases=True))):
                return Wheel(name, got_version, existing.name, existing.stat().st_size, requires)
        return None

    def target(name: str, spec: SpecifierSet, pin: str | None) -> str:
        return f"{name}=={pin}" if pin else f"{name}{spec}"

    def fetch(name: str, spec: SpecifierSet, pin: str | None) -> Wheel:
        found = there(name, spec, pin)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory() as tmp:
            done = download([target(name, spec, pin)], tmp)
            files = list(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or len(files) != 1:
                raise Refusal(f"no wheel of {target(name, spec, pin)} for Python {python} on "
                              f"{platform}: "
                              f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            path = folder / files[0].name
            shutil.move(str(files[0]), path)
        got_name, got_version, requires = wheel_metadata(path)
        return Wheel(got_name, got_version, path.name, path.stat().st_size, requires)

    def prefetch(wanted: list[tuple[str, SpecifierSet, str | None]]) -> None:
        """The wheels the folder lacks of `wanted`, in one pip process. If it fails, nothing
        is kept: fetch then asks for each alone, and the one that has no wheel is named."""
        targets = [target(*w) for w in wanted if there(*w) is None]
        if not targets:
            return
        with tempfile.TemporaryDirectory() as tmp:
            if download(targets, tmp).returncode == 0:
                for path in Path(tmp).glob("*.whl"):
                    shutil.move(str(path), folder / path.name)

    fetch.prefetch = prefetch  # type: ignore[attr-defined]
    return fetch


INSTALL_SH = r"""#!/usr/bin/env bash
# Installs this wheelhouse offline (no index is contacted), then checks the imports.
#   bash install.sh                 into the running python3 (or $PYTHON)
#   bash install.sh --target DIR    into DIR, put on sys.path by a .pth file in site-packages
# and puts the checkout it sits in ($FASTDIFF_REPO to name another) on sys.path the same way.
# A .pth file, not PYTHONPATH: a notebook kernel started with its own environment (nbclient,
# tests/test_notebooks.py) would not see PYTHONPATH-only packages. Made by tools/wheelhouse.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
want=__PYTHON__
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "$want" ]; then
  echo "install.sh: this wheelhouse is for Python $want, $PY is $have; build one for it: make wheelhouse WH_PYTHON=$have HAVE=..." >&2
  exit 2
fi
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "${1:-}" = "--target" ]; then
  target=$(mkdir -p "$2" && cd "$2" && pwd)
  "$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --upgrade --target "$target" "$here"/wheels/*.whl
  echo "$target" > "$site/fastdiff-wheelhouse.pth"
else
  "$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check "$here"/wheels/*.whl
fi
# the course's own package: the checkout this wheelhouse sits in (or $FASTDIFF_REPO), on
# sys.path the same way
repo=$(cd "${FASTDIFF_REPO:-$here/..}" && pwd)
if [ -d "$repo/fastdiff_helpers" ]; then echo "$repo" > "$site/fastdiff-repo.pth"; fi
cd /
HF_HUB_OFFLINE=1 "$PY" - <<'EOF'
import torch, diffusers, torchao, fastdiff_helpers
from fastdiff_helpers.measure.env import below_floor
print(f"torch {torch.__version__}, diffusers {diffusers.__version__}, torchao {torchao.__version__}, "
      f"fastdiff_helpers from {fastdiff_helpers.__path__[0]}")
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (no CUDA device)")
below = below_floor()
print("floor:", "; ".join(below) if below else "every version at or above fastdiff's floor")
EOF
"""


def claim(out: Path, python: str, platform: str) -> None:
    """OUT must be new, empty, or a wheelhouse (it holds manifest.json): its stale wheels are
    deleted, so a folder of someone else's is refused. The manifest is written first (marked
    unfinished), so a cut build's folder is still known as one."""
    manifest = out / "manifest.json"
    if out.is_dir() and any(out.iterdir()):
        try:
            ours = "wheels" in json.loads(manifest.read_text())
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise Refusal(f"{out} holds files that are not a wheelhouse's (no manifest.json "
                          "from tools/wheelhouse.py): give a new or empty --out")
    elif out.exists() and not out.is_dir():
        raise Refusal(f"{out} is a file: give a folder for --out")
    out.mkdir(parents=True, exist_ok=True)
    if not manifest.exists():
        manifest.write_text(json.dumps({"python": python, "platform": platform, "wheels": None,
                                        "state": "unfinished"}) + "\n")


def build(have: dict[str, str | None], out: Path, python: str, platform: str,
          notebooks: bool = True, index: Index | None = None, root: Path = ROOT) -> dict:
    """Check the floor, resolve, download, write OUT/install.sh and OUT/manifest.json."""
    requirements, requires_python = project_requirements(root)
    check_floor(have, python, requirements, requires_python)
    claim(out, python, platform)
    roots = requirements + TESTS + (NOTEBOOKS if notebooks else [])
    wheels_dir = out / "wheels"
    index = index or pip_index(wheels_dir, python, platform)
    wheels = resolve(roots, have, index, python, platform, pins(root))
    keep = {w.filename for w in wheels}
    for stale in wheels_dir.glob("*.whl"):  # from an earlier build for another target
        if stale.name not in keep:
            stale.unlink()
    total = sum(w.size for w in wheels)
    manifest = {"python": python, "platform": platform, "notebooks": notebooks,
                "total_bytes": total,
                "wheels": [{"name": w.name, "version": w.version, "file": w.filename,
                            "bytes": w.size, "needed_by": w.needed_by, "replaces": w.replaces}
                           for w in wheels]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    script = out / "install.sh"
    script.write_text(INSTALL_SH.replace("__PYTHON__", ".".join(python.split(".")[:2])))
    script.chmod(0o755)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--have", required=True,
                        help="the target's packages: a pip freeze file, or a list of name==version")
    parser.add_argument("--python", default=None,
                        help="the target's Python (default: python==X.Y in HAVE, else 3.12)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument("--out", default=str(ROOT / "wheelhouse"))
    parser.add_argument("--no-notebooks", action="store_true",
                        help="leave out what headless notebook runs need (nbclient, ipykernel...)")
    args = parser.parse_args(argv)
    if not args.have.strip():
        print("wheelhouse: HAVE= is empty. Give the target's packages: on that machine run "
              "`python3 -m pip freeze > have.txt` and pass HAVE=have.txt (or a list such as "
              "HAVE='torch==2.11.0 transformers==5.17.0'); tools/images/ holds known images.",
              file=sys.stderr)
        return 2
    have = read_have(args.have)
    listed = have.pop("python", None)
    args.python = args.python or (".".join(listed.split(".")[:2]) if listed else "3.12")
    out = Path(args.out)
    try:
        manifest = build(have, out, args.python, args.platform, not args.no_notebooks)
    except Refusal as exc:
        print(f"wheelhouse: refused: {exc}", file=sys.stderr)
        return 2
    for w in manifest["wheels"]:
        extra = f", replaces {w['replaces']}" if w["replaces"] else ""
        print(f"  {w['name']} {w['version']} ({w['bytes'] / 2**20:.1f} MiB, for {w['needed_by']}{extra})")
    print(f"wheelhouse: {len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 1e6:.1f} MB, "
          f"for Python {args.python} on {args.platform}, in {out}. On the target: "
          f"bash {out.name}/install.sh (or --target DIR).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
