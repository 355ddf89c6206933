"""The course clock's record refreshed: clock_record.py rewritten from the notebooks' smoke runs'
logs (out/clock after a make test: one <notebook>.jsonl each). It writes the package's source,
so it lives in tools/, in the clone: `.venv/bin/python -m tools.clock_refresh out/clock`.
tests/test_notebooks.py checks every smoke run against the record (course/planning/clock.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fastdiff_helpers.course.planning import clock_record
from fastdiff_helpers.course.planning.clock import read_log, summarize
from fastdiff_helpers.errors import FastdiffError

ROOT = Path(__file__).resolve().parents[1]


def refresh(folder: str | Path, target: str | Path | None = None,
            notebooks: Path | None = None) -> Path:
    """Write clock_record.py from the smoke runs' logs in `folder` (out/clock after a make
    test: one <notebook>.jsonl each). A notebook without a log there keeps its record (one
    notebook's smoke run refreshes its own); a notebook no longer in `notebooks` (default: the
    course's folder) loses it. Returns the file written."""
    logs = sorted(Path(folder).glob("*.jsonl"))
    if not logs:
        raise FastdiffError(f"{folder} holds no <notebook>.jsonl: run the notebooks' smoke test "
                            "first (make test, or pytest tests/test_notebooks.py -k smoke).")
    folder_of_notebooks = notebooks or ROOT / "notebooks"
    existing = {p.name for p in folder_of_notebooks.glob("*.ipynb")}
    recorded = {name: cells for name, cells in clock_record.RECORDED.items()
                if name in existing}
    recorded.update({f"{log.stem}.ipynb": summarize(read_log(log)) for log in logs})
    target = Path(target) if target else Path(clock_record.__file__)
    head = target.read_text().split("RECORDED", 1)[0] if target.exists() else ""
    lines = ["RECORDED: dict = {"]
    for notebook, cells in sorted(recorded.items()):  # a cell a line: diffs say which changed
        lines.append(f"    {notebook!r}: {{")
        lines += [f"        {cell!r}: {_literal(work)}," for cell, work in cells.items()]
        lines.append("    },")
    target.write_text(head + "\n".join(lines) + "\n}\n")
    return target


def _literal(value: Any) -> str:
    """A Python literal of JSON-like data, on one line, its keys sorted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_literal(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: .venv/bin/python -m tools.clock_refresh out/clock")
    try:
        print(f"fastdiff: wrote {refresh(sys.argv[1])}")
    except FastdiffError as exc:
        sys.exit(f"fastdiff: {exc}")
