"""`make test`: the whole suite in two phases, then where its time went.

1. Every test not marked `alone`, spread over one pytest-xdist worker per core (at most 4; on
   the 2-core machine this course is built on, two), each worker with one torch thread
   (tests/conftest.py: torch's OpenMP threads spin while they wait, so two workers of two
   threads each on two cores slow each other down). Each module's tests run in one worker, in
   order (each notebook's smoke run apart), the longest first (tests/conftest.py).
2. The tests marked `alone`, in one process with the machine to itself: they compare a
   wall-clock time with another one (a cold compile against a warm one, two processes against
   one), which a second worker's load would move.

Both phases share one fresh compile cache (FASTDIFF_CACHE_DIR, a temporary folder removed at the
end), so a tiny pipeline compiled by one test is a cache hit for the next, in any process; the
tests about cold compiles make their own. Then it prints where the time went: the costliest test
files (each file's worker-seconds, both phases), the slowest tests of both phases, the seconds of
each phase and the total. Arguments go to both pytest runs
(`make test ARGS="-k notebooks"`). Exit status: the first phase's failure, else the second's.

    python tools/test_suite.py [pytest arguments]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "out" / "test-suite"
SLOWEST = 15
NO_TESTS = 5  # pytest's exit status when a selection leaves nothing to run


def workers() -> int:
    """One xdist worker per core this process may use, at most 4 (each executes notebooks and
    compiles: more would trade memory for little); 0 (no xdist) on one core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 0 if (cores or 1) < 2 else min(4, cores)


def phases(extra: list[str]) -> list[tuple[str, list[str]]]:
    n = workers()
    spread = ["-n", str(n), "--dist", "loadscope", "--no-loadscope-reorder"] if n else []
    return [(f"parallel ({n} workers)" if n else "parallel (1 process: one core)",
             [*spread, "-m", "not alone", *extra]),
            ("alone", ["-m", "alone", *extra])]


def durations(junit: Path) -> list[tuple[float, str]]:
    """(seconds, test id) of every test in a junit XML file: setup, call and teardown."""
    if not junit.is_file():
        return []
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = (case.get("classname") or "").replace(".", "/")
        found.append((float(case.get("time") or 0), f"{module}.py::{case.get('name')}"))
    return found


def per_file(tests: list[tuple[float, str]]) -> list[tuple[float, int, str]]:
    """(seconds, tests, file) of each test file, both phases together, the costliest first: the
    seconds are a worker's (in the parallel phase two files run at once, so they add up to more
    than the phase's wall-clock time)."""
    files: dict[str, list[float]] = {}
    for seconds, name in tests:
        files.setdefault(name.split("::")[0], []).append(seconds)
    return sorted(((sum(s), len(s), name) for name, s in files.items()), reverse=True)


def summary(runs: list[tuple[str, float, int, Path]]) -> str:
    """Where the time went: the test files that took the most, the slowest tests of every
    phase together, then each phase's seconds and the total."""
    tests = sorted((t for _, _, _, junit in runs for t in durations(junit)), reverse=True)
    files = per_file(tests)
    lines = [f"costliest {min(SLOWEST, len(files))} test files (worker-seconds, both phases; "
             f"all {len(files)}: {sum(s for s, _, _ in files):.0f} s):"]
    lines += [f"  {seconds:7.1f} s  {name} ({n} tests)" for seconds, n, name in files[:SLOWEST]]
    lines.append(f"slowest {min(SLOWEST, len(tests))} tests (setup + call + teardown):")
    lines += [f"  {seconds:7.1f} s  {name}" for seconds, name in tests[:SLOWEST]]
    for name, seconds, status, _ in runs:
        lines.append(f"phase {name}: {seconds / 60:.1f} min, exit status {status}")
    total = sum(seconds for _, seconds, _, _ in runs)
    lines.append(f"make test: {total / 60:.1f} min in all ({int(total) // 60} min "
                 f"{int(total) % 60} s) on {os.cpu_count()} cores")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    REPORTS.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="fastdiff-test-cache-"))
    env = dict(os.environ, FASTDIFF_CACHE_DIR=str(cache))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the course's folder, not one set outside
    runs = []
    try:
        for i, (name, args) in enumerate(phases(argv)):
            junit = REPORTS / f"phase-{i + 1}.xml"
            junit.unlink(missing_ok=True)
            print(f"fastdiff: make test, phase {i + 1} of 2: {name}", flush=True)
            started = time.perf_counter()
            status = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs",
                                     f"--junitxml={junit}", *args], cwd=ROOT, env=env).returncode
            runs.append((name, time.perf_counter() - started, status, junit))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print("\n" + summary(runs), flush=True)
    failed = [status for _, _, status, _ in runs if status not in (0, NO_TESTS)]
    if runs and all(status == NO_TESTS for _, _, status, _ in runs):
        return NO_TESTS
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
