"""The JSONL store of Results (the record itself: record.py).

Introduced in 01_baseline.ipynb. One Result is one benchmarked configuration: what ran
(model, weights, recipe, resolution, steps), where (device, env) and every timing sample,
not only the median. ``save_results`` appends them, ``load_results`` reads them back exactly.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Iterable

from ..errors import FastdiffError
from .. import checks
from ..measure.record import SCHEMA_VERSION, Result, ResultsFormatError  # noqa: F401 (public here)

__all__ = ["SCHEMA_VERSION", "Result", "ResultsFormatError", "save_results", "load_results"]


def _repair_tail(path: Path) -> None:
    """If the file does not end in a newline, end the last line (valid) or drop it (cut write)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as fh:  # the last byte first: a whole file is read only to repair it
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        data = fh.read()
    start = data.rfind(b"\n") + 1
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        try:
            json.loads(data[start:].decode("utf-8"))
            os.write(fd, b"\n")
        except ValueError:
            warnings.warn(
                f"{path}: dropping an incomplete last record ({len(data) - start} bytes, "
                "cut by an interrupted write) before appending",
                stacklevel=3,
            )
            os.ftruncate(fd, start)
        os.fsync(fd)
    finally:
        os.close(fd)


def is_results_file(path: Path) -> bool:
    """An existing file is a results file when it is empty or its first line is a record
    (save_results began it; a bad line later is load_results's to name); a last line without
    its newline may be a cut record, but only if it starts like one."""
    try:
        *lines, tail = path.read_bytes().split(b"\n")
        if tail.strip() and not tail.lstrip().startswith(b"{"):
            return False
        first = next((line for line in lines if line.strip()), None)
        if first is not None:
            Result.from_dict(json.loads(first.decode("utf-8")))
    except (OSError, ValueError, TypeError):  # UnicodeDecodeError, JSONDecodeError: ValueErrors
        return False
    return True


RESULTS_FILE = "a results file (JSON lines written by fdh.save_results)"


def save_results(results: Result | Iterable[Result], path: str | os.PathLike) -> Path:
    """Append results to a JSONL file (one record per line), creating folders; returns the path.

    Each record is one ``os.write`` on an ``O_APPEND`` descriptor followed by ``fsync``, so
    earlier records survive a crash. An existing file that is not a results file is refused,
    never appended to. Introduced in 01_baseline.ipynb.
    """
    path = checks.output_file("path", path, ours=is_results_file, what=RESULTS_FILE)
    records = [results] if isinstance(results, Result) else list(results)
    for r in records:
        if not isinstance(r, Result):
            raise TypeError(f"save_results takes Result objects, got {type(r).__name__}")
    lines = [
        (json.dumps(r.to_dict(), sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
        for r in records  # encode all first: a bad record writes nothing
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    _repair_tail(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for line in lines:
            written = os.write(fd, line)
            while written < len(line):  # a regular file writes it whole; be safe anyway
                written += os.write(fd, line[written:])
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_results(path: str | os.PathLike) -> list[Result]:
    """Read every Result from a JSONL file written by save_results(). Introduced in
    17_all_models.ipynb (its exercises).

    Blank lines are skipped. A last line without its newline that does not parse (a write cut
    by a kill) is skipped with a warning; any other bad line raises ResultsFormatError naming
    the file and its 1-based line number.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}; run a benchmark and save_results() first")
    if path.is_dir():
        raise FastdiffError(f"{checks.arg('path', str(path))} is a folder; give the results file "
                            f"in it, e.g. {path / 'results.jsonl'}.")
    chunks = path.read_bytes().split(b"\n")
    results = []
    for i, chunk in enumerate(chunks, start=1):
        if not chunk.strip():
            continue
        try:
            record = json.loads(chunk.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if i == len(chunks):  # the file does not end with a newline
                warnings.warn(
                    f"{path}:{i}: skipping an incomplete last record (a write cut short): {e}",
                    stacklevel=2,
                )
                continue
            raise ResultsFormatError(f"{path}:{i}: not valid JSON ({e})") from e
        try:
            results.append(Result.from_dict(record))
        except (ValueError, TypeError) as e:
            raise ResultsFormatError(f"{path}:{i}: not a valid result record: {e}") from e
    return results
