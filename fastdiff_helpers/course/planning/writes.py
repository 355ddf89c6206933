"""What the course's runs write, and where: a run's own folder (refused when it holds files
someone else wrote), a file written whole or not at all, and a file left as it is when it
already holds the bytes to write. The core's checks of a path (checks.py) come first in each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ...checks import arg, pathlike, writable, writable_parent
from ...errors import FastdiffError


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `path` whole or not at all: into a temporary file beside it, then moved over it (a
    killed write never leaves half a file under the real name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _made_here(path: Path) -> list[str]:
    """The names in a folder, less the hidden temporary files of a cut write (".x.123.tmp")."""
    return sorted(p.name for p in path.iterdir()
                  if not (p.name.startswith(".") and ".tmp" in p.name))


def output_folder(name: str, value: Any, ours: Sequence[str] = (), what: str = "fastdiff"
                  ) -> Path:
    """A folder to write into: an existing folder, or one that can be created (checked now,
    created by the caller when it writes). With `ours`, the names the writer makes in it (the
    first is the record that marks a folder as its own): an existing folder must be empty,
    hold that record, or hold nothing but those names (a run cut before its record); a
    folder with anything else is someone else's and is refused, so nothing in it is written
    over."""
    path = pathlike(name, value)
    if path.exists():
        if not path.is_dir():
            raise FastdiffError(f"{arg(name, str(path))}: {path} is a file; give a folder (it "
                                "is created if missing).")
        writable(name, path, path)
        held = _made_here(path) if ours else []
        others = [n for n in held if n not in ours]
        if others and ours[0] not in held:
            raise FastdiffError(
                f"{arg(name, str(path))}: {path} holds files that {what} did not write "
                f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}), so nothing is "
                f"written there; give a new or empty folder (it is created if missing), or one "
                f"{what} wrote before (it holds {ours[0]}).")
        return path
    writable_parent(name, path)
    return path


def same_bytes(path: Path, data: bytes) -> bool | None:
    """None when `path` does not exist, else whether it holds exactly `data` (a writer that
    would write the same bytes leaves the file as it is; other bytes are someone else's)."""
    if not path.exists():
        return None
    return path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data
