"""Compile caches, the torch way: one cache folder for the course, and portable artifacts.

Introduced in 05_cold_start.ipynb. inductor keeps compiled kernels and graphs in
TORCHINDUCTOR_CACHE_DIR (torch/_inductor/runtime/cache_dir_utils.py reads it on every use);
torch.compiler.save_cache_artifacts() / load_cache_artifacts() carry what one process
compiled to another machine. An artifact is only valid for the same torch, triton and GPU
kind, so the file written here starts with a header of those, checked before loading.

A compile-cache file is code. What load_cache_artifacts reads back (torch/compiler/_cache.py
CacheArtifactManager.deserialize, then populate_caches) goes into inductor's cache as compiled
graphs that inductor unpickles when it uses them (torch/_inductor/codecache.py, pickle.loads)
and generated Python and kernels that run. Load only files from someone you trust, as with any
pickle, and check the SHA-256 that `warm --out` printed: `warm --load FILE --sha256 HEX`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import FastdiffError
from .. import checks
from ..models.presets import get_spec
from ..models.pretrained import check_weights
from .env import env_report

MAGIC = b"FASTDIFF-COMPILE-CACHE 1\n"
# what must match between the machine that compiled and the one that loads
MUST_MATCH = ("torch", "triton", "python", "device", "gpu_name", "compute_capability")


def default_cache_dir() -> Path:
    """The course's compile cache: $FASTDIFF_CACHE_DIR, else ~/.cache/fastdiff/inductor."""
    root = os.environ.get("FASTDIFF_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "fastdiff" / "inductor"


def _users_cache_dir() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR when the user set it; None when unset or when it holds inductor's
    own default. Inductor writes its default into the variable the first time it finds it
    unset (torch/_inductor/runtime/cache_dir_utils.py, cache_dir(), line 19), and importing
    torch._dynamo already does so (torch/_dynamo/package.py:1267, `DynamoCache = ...`), which
    diffusers imports: after fdh.load_pipeline the variable is set whoever chose nothing."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as inductor_default

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if (not current or os.path.abspath(current) == os.path.abspath(inductor_default())
            or current == _ours.get("folder")):
        return None
    return current


_said: set[str] = set()  # the folders already said in this process
_ours: dict[str, str] = {}  # the default folder use_course_cache itself put in the variable


def use_course_cache(path: str | os.PathLike | None = None, verbose: bool = True) -> Path:
    """Point inductor's cache at one folder for the whole course and say where it is.

    Your own TORCHINDUCTOR_CACHE_DIR wins unless `path` is given (inductor's default folder,
    which inductor writes into the variable itself, does not count as yours). Called by
    fdh.compile_pipeline before compiling, so the first compile of a process says where its
    kernels go; call it yourself to choose another folder.
    Introduced in 05_cold_start.ipynb."""
    if path is not None:
        checks.output_folder("path", path)
    users = _users_cache_dir()
    if path is None and users:
        folder = Path(users)
        whose = "yours: TORCHINDUCTOR_CACHE_DIR"
    else:
        folder = Path(path) if path is not None else default_cache_dir()
        whose = ("TORCHINDUCTOR_CACHE_DIR; set FASTDIFF_CACHE_DIR or call "
                 "fdh.use_course_cache(path) to move it")
    folder = folder.absolute()
    folder.mkdir(parents=True, exist_ok=True)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(folder):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        if path is None:  # the course's default; a path you give stays yours
            _ours["folder"] = str(folder)
        # what torch's own temporary_cache_dir does after a switch (cache_dir_utils.py): drop
        # the in-memory caches that hold paths of the old folder
        from torch._inductor.utils import clear_caches

        clear_caches()
    if verbose and str(folder) not in _said:
        _said.add(str(folder))
        print(f"fastdiff: torch.compile cache in {folder} ({whose})")
    return folder


def _stamp() -> dict[str, Any]:
    env = env_report()
    return {key: env.get(key) for key in MUST_MATCH} | {"diffusers": env.get("diffusers"),
                                                       "torchao": env.get("torchao")}


def save_artifacts(path: str | os.PathLike, **what: Any) -> dict[str, Any]:
    """Write what this process compiled (torch.compiler.save_cache_artifacts) to `path`, with
    a header of the versions and GPU kind it is valid for, and `what` (model, steps...) for
    the record. Returns the header. Nothing compiled yet: a clear error."""
    checks.output_file("path", path, example="sdxl.fdcache")
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        raise FastdiffError("Nothing was compiled in this process, so there is no cache to save: "
                            "run a compiled pipeline first (fdh.generate after fdh.apply).")
    payload, info = saved
    header = dict(_stamp(), **what, artifacts=_count(info), bytes=len(payload))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    data = MAGIC + json.dumps(header).encode() + b"\n" + payload
    tmp.write_bytes(data)
    tmp.replace(path)  # a killed save never leaves half a file under the real name
    return dict(header, sha256=hashlib.sha256(data).hexdigest())


def read_header(path: str | os.PathLike,
                sha256: str | None = None) -> tuple[dict[str, Any], bytes]:
    """The header and payload of a file from save_artifacts. With `sha256`, the file's bytes
    must hash to it, checked before anything in it is parsed."""
    path = Path(path)
    if not path.is_file():
        raise FastdiffError(f"{path} is not a file: pass the file written by "
                            "`python -m fastdiff_helpers warm --out FILE`.")
    data = path.read_bytes()
    if sha256 is not None:
        found = hashlib.sha256(data).hexdigest()
        if found != sha256.strip().lower():
            raise FastdiffError(
                f"{path} has SHA-256 {found}, not the {sha256.strip()} you were given: it is "
                "not that file (changed, cut, or another one). Nothing was loaded: a "
                "compile-cache file holds code that runs, so load only the exact file from "
                "someone you trust.")
    if not data.startswith(MAGIC):
        raise FastdiffError(f"{path} is not a fastdiff compile-cache file (written by "
                            "`python -m fastdiff_helpers warm --out FILE`).")
    line, _, payload = data[len(MAGIC):].partition(b"\n")
    return json.loads(line), payload


def load_artifacts(path: str | os.PathLike, sha256: str | None = None) -> dict[str, Any]:
    """Load a file from save_artifacts into this machine's compile cache, after checking its
    SHA-256 when given (before anything in it is read: the file holds code that will run) and
    that it was made with the same torch, triton, Python and GPU kind; refuses otherwise,
    naming each difference. Returns the header.
    Introduced in 05_cold_start.ipynb."""
    header, payload = read_header(path, sha256)
    here = _stamp()
    different = [f"{key}: file {header.get(key)!r}, here {here[key]!r}" for key in MUST_MATCH
                 if header.get(key) != here[key]]
    if different:
        raise FastdiffError(f"{path} was compiled elsewhere and cannot be used here ("
                            + "; ".join(different) + "). Run `python -m fastdiff_helpers warm` "
                            "on this machine instead.")
    use_course_cache(verbose=False)
    info = torch.compiler.load_cache_artifacts(payload)
    return dict(header, loaded=_count(info))


def _count(info: Any) -> dict[str, int]:
    """How many artifacts of each kind a torch CacheInfo holds."""
    fields = getattr(info, "artifacts", None) or {}
    return {str(kind): len(items) for kind, items in dict(fields).items()}


def first_image_in_new_process(cache_dir: str | os.PathLike, model: str = "sdxl",
                               weights: str = "auto", device: str | None = None,
                               steps: int | None = None, ladder: str = "course",
                               step: str = "+ compile", out: str | os.PathLike | None = None,
                               load: str | os.PathLike | None = None) -> tuple[float, str]:
    """Seconds a new Python process takes to its first compiled image (import, load, compile
    and call: `python -m fastdiff_helpers warm` for one ladder step) with `cache_dir` as its
    compile cache, and what it printed. `out`: also write the artifacts; `load`: only load an
    artifact file into `cache_dir` (no image). What 05_cold_start.ipynb measures.
    Introduced in 05_cold_start.ipynb."""
    checks.output_folder("cache_dir", cache_dir)
    if load is not None:
        checks.existing_file("load", load, "a file written by `python -m fastdiff_helpers warm "
                             "--out FILE`")
    else:
        get_spec(model)
        check_weights(weights)
        checks.whole("steps", steps, 1, none=True)
        if device is not None:
            checks.device(device)
        if out is not None:
            checks.output_file("out", out, example=f"{model}.fdcache")
    if load is not None:
        args = ["--load", str(load)]
    else:
        args = ["--model", model, "--weights", weights, "--ladder", ladder, "--only", step,
                *(["--device", device] if device else []), *(["--steps", str(steps)] if steps
                                                           else []),
                *(["--out", str(out)] if out is not None else [])]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fastdiff_helpers", "warm", *args], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise FastdiffError(f"`python -m fastdiff_helpers warm {' '.join(args)}` failed: {tail}")
    return seconds, done.stdout
