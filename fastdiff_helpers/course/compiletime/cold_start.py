"""Cold start across processes and machines: portable compile artifacts, and the time a new
process takes to its first compiled image.

Introduced in 05_cold_start.ipynb. The course's cache folder (where inductor keeps what it
compiled) is course/planning/compile_cache.py; torch.compiler.save_cache_artifacts() /
load_cache_artifacts() carry what one process compiled to another machine. An artifact is only valid for the same torch, triton and GPU
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

from ...errors import FastdiffError
from ... import checks
from ...models.presets import get_spec
from ...models.pretrained import check_weights
from ..planning.compile_cache import use_course_cache
from ...measure.env import env_report
from ..planning.writes import output_folder

MAGIC = b"FASTDIFF-COMPILE-CACHE 1\n"
# what must match between the machine that compiled and the one that loads
MUST_MATCH = ("torch", "triton", "python", "device", "gpu_name", "compute_capability")


def _stamp() -> dict[str, Any]:
    env = env_report()
    return {key: env.get(key) for key in MUST_MATCH} | {"diffusers": env.get("diffusers"),
                                                       "torchao": env.get("torchao")}


def save_artifacts(path: str | os.PathLike, **what: Any) -> dict[str, Any]:
    """Write what this process compiled (torch.compiler.save_cache_artifacts) to `path`, with
    a header of the versions and GPU kind it is valid for, and `what` (model, steps...) for
    the record. Returns the header. Nothing compiled yet: a clear error; an existing file at
    `path` that is not such a file is left as it is (refused)."""
    check_artifacts_path("path", path)
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        raise FastdiffError("Nothing was compiled in this process, so there is no cache to save: "
                            "run a compiled pipeline first (fdh.generate after fdh.apply).")
    payload, info = saved
    header = dict(_stamp(), **what, artifacts=_count(info), bytes=len(payload))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = MAGIC + json.dumps(header).encode() + b"\n" + payload
    tmp.write_bytes(data)
    tmp.replace(path)  # a killed save never leaves half a file under the real name
    return dict(header, sha256=hashlib.sha256(data).hexdigest())


def check_artifacts_path(name: str, path: str | os.PathLike) -> Path:
    """A path save_artifacts may write: new, or a compile-cache file it wrote before."""
    return checks.output_file(name, path, "sdxl.fdcache", lambda p: checks.file_starts(p, MAGIC),
                              "a fastdiff compile-cache file (`warm --out`)")


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
    Introduced in docs/instructor.md."""
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
                               load: str | os.PathLike | None = None,
                               tuning_root: str | os.PathLike | None = None,
                               progress: bool = True) -> tuple[float, str]:
    """Seconds a new Python process takes to its first compiled image (import, load, compile
    and call: `python -m fastdiff_helpers warm` for one ladder step) with `cache_dir` as its
    compile cache, and what it printed. `out`: also write the artifacts; `load`: only load an
    artifact file into `cache_dir` (no image). `tuning_root`: the process imports the tuning
    bundles of this machine under it first (warm --tuning-root; default: none, so nothing but
    `cache_dir` helps it). `progress`: the process's output is printed as it comes, and the
    time elapsed while it is silent (a compile there takes minutes on a GPU). What
    05_cold_start.ipynb measures.
    Introduced in docs/instructor.md."""
    output_folder("cache_dir", cache_dir)
    if load is not None:
        checks.existing("load", load, "a file written by `python -m fastdiff_helpers warm "
                        "--out FILE`")
    else:
        get_spec(model)
        check_weights(weights)
        checks.whole("steps", steps, 1, none=True)
        if device is not None:
            checks.device(device)
        if out is not None:
            check_artifacts_path("out", out)
    if load is not None:
        args = ["--load", str(load)]
    else:
        args = ["--model", model, "--weights", weights, "--ladder", ladder, "--only", step,
                *(["--device", device] if device else []), *(["--steps", str(steps)] if steps
                                                           else []),
                *(["--out", str(out)] if out is not None else []),
                *(["--tuning-root", str(tuning_root)] if tuning_root is not None else
                  ["--no-tuning"])]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    started = time.perf_counter()
    out, err, code = _streamed([sys.executable, "-m", "fastdiff_helpers", "warm", *args], env,
                               progress)
    seconds = time.perf_counter() - started
    if code != 0:
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        raise FastdiffError(f"`python -m fastdiff_helpers warm {' '.join(args)}` failed: {tail}")
    return seconds, out


HEARTBEAT_S = 30.0


def _streamed(command: list[str], env: dict, progress: bool) -> tuple[str, str, int]:
    """Run `command`; with `progress`, print each line of its output as it comes (indented)
    and, while it says nothing, the time elapsed every HEARTBEAT_S seconds: a compile in a new
    process takes minutes on a GPU, and a cell that shows nothing for that long looks hung.
    Returns (stdout, stderr, exit code)."""
    import queue
    import threading

    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue = queue.Queue()
    kept: dict[str, list[str]] = {"out": [], "err": []}

    def read(stream, name):
        for line in stream:
            kept[name].append(line)
            lines.put((name, line))
        lines.put((name, None))

    readers = [threading.Thread(target=read, args=(proc.stdout, "out"), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, "err"), daemon=True)]
    for reader in readers:
        reader.start()
    started = last = time.monotonic()
    open_streams = 2
    while open_streams:
        try:
            name, line = lines.get(timeout=1.0)
        except queue.Empty:
            if progress and time.monotonic() - last >= HEARTBEAT_S:
                last = time.monotonic()
                elapsed = last - started
                print(f"  ... {int(elapsed // 60)}:{int(elapsed % 60):02d} elapsed, the new "
                      "process is still working", flush=True)
            continue
        if line is None:
            open_streams -= 1
        elif progress and name == "out":
            last = time.monotonic()
            print("  | " + line.rstrip("\n"), flush=True)
    return "".join(kept["out"]), "".join(kept["err"]), proc.wait()
