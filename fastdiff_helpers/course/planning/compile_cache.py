"""The course's compile cache: one folder for every compiled kernel and graph, said once.

Introduced in 05_cold_start.ipynb. inductor keeps compiled kernels and graphs in
TORCHINDUCTOR_CACHE_DIR (torch/_inductor/runtime/cache_dir_utils.py reads it on every use);
the course's tuning decision (autotune.py course_tuning, which the lessons and the command
line pass to fdh.apply and fdh.compile_pipeline as tuning=) points it at the course's folder
before compiling. Without it the core leaves the folder to torch. Carrying a cache to another
machine: course/compiletime/cold_start.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from .writes import output_folder


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
    which inductor writes into the variable itself, does not count as yours). Called by the
    course's tuning decision before compiling (fdh.course.settings(...).tuning, passed to
    fdh.apply and fdh.compile_pipeline as tuning=), so the first compile of a process says
    where its kernels go; call it yourself to choose another folder.
    Introduced in 04_torch_compile.ipynb."""
    if path is not None:
        output_folder("path", path)
    users = _users_cache_dir()
    if path is None and users:
        folder = Path(users)
        whose = "yours: TORCHINDUCTOR_CACHE_DIR"
    else:
        folder = Path(path) if path is not None else default_cache_dir()
        whose = ("TORCHINDUCTOR_CACHE_DIR; set FASTDIFF_CACHE_DIR or call "
                 "fdh.course.use_course_cache(path) to move it")
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
