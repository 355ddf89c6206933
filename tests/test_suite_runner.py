"""`make test` itself (tools/test_suite.py, issue 36): two phases, the `alone` tests apart, one
shared compile cache, and a summary of where the time went."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("test_suite", ROOT / "tools" / "test_suite.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)


def test_the_alone_tests_run_after_the_others_and_nowhere_else(monkeypatch):
    monkeypatch.setattr(suite, "workers", lambda: 2)
    (name1, first), (name2, second) = suite.phases(["-k", "x"])
    assert first[:6] == ["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder", "-m"]
    assert first[6] == "not alone" and second == ["-m", "alone", "-k", "x"]
    assert first[-2:] == ["-k", "x"] and "2 workers" in name1 and name2 == "alone"
    monkeypatch.setattr(suite, "workers", lambda: 0)  # one core: no xdist at all
    (_, first), _ = suite.phases([])
    assert first == ["-m", "not alone"]


def test_the_summary_names_the_costliest_files_the_slowest_tests_and_the_total(tmp_path):
    def junit(name, cases):
        path = tmp_path / name
        path.write_text("<testsuites><testsuite>" + "".join(
            f'<testcase classname="tests.{m}" name="{t}" time="{s}"/>' for m, t, s in cases)
            + "</testsuite></testsuites>")
        return path

    one = junit("1.xml", [("test_a", "test_x", 2.5), ("test_b", "test_y[p]", 40.0)])
    two = junit("2.xml", [("test_c", "test_z", 7.25)])
    text = suite.summary([("parallel (2 workers)", 600.0, 0, one), ("alone", 90.0, 1, two),
                          ("missing", 0.0, 5, tmp_path / "none.xml")])
    lines = text.splitlines()
    assert lines[0] == "costliest 3 test files (worker-seconds, both phases; all 3: 50 s):"
    assert [line.split("  ")[-1] for line in lines[1:4]] == [
        "tests/test_b.py (1 tests)", "tests/test_c.py (1 tests)", "tests/test_a.py (1 tests)"]
    assert lines[4] == "slowest 3 tests (setup + call + teardown):"
    assert [line.split("  ")[-1] for line in lines[5:8]] == [
        "tests/test_b.py::test_y[p]", "tests/test_c.py::test_z", "tests/test_a.py::test_x"]
    assert "40.0 s" in lines[5] and "7.2 s" in lines[6]
    assert suite.per_file([(1.0, "tests/a.py::x"), (2.5, "tests/b.py::y"), (2.0, "tests/a.py::z")]) \
        == [(3.0, 2, "tests/a.py"), (2.5, 1, "tests/b.py")]  # a file's tests add up
    assert "phase parallel (2 workers): 10.0 min, exit status 0" in text
    assert "phase alone: 1.5 min, exit status 1" in text
    assert lines[-1].startswith("make test: 11.5 min in all (11 min 30 s)")


def test_a_failing_phase_fails_make_test_and_both_phases_run(tmp_path, monkeypatch):
    """The runner on a throwaway test folder: phase 1 fails, phase 2 still runs, the exit
    status is phase 1's, and the alone test ran only in phase 2."""
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "test_x.py").write_text(textwrap.dedent("""\
        import os, pytest
        def test_fails():
            assert os.environ["FASTDIFF_CACHE_DIR"] and False
        @pytest.mark.alone
        def test_alone():
            pass
        """))
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: x\n")
    monkeypatch.setattr(suite, "ROOT", folder)
    monkeypatch.setattr(suite, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(suite, "workers", lambda: 0)
    calls = []
    real = subprocess.run

    def run(cmd, **kw):
        calls.append(cmd)
        return real(cmd + ["-p", "no:cacheprovider"], **kw)

    monkeypatch.setattr(suite.subprocess, "run", run)
    status = suite.main([])
    assert status == 1 and len(calls) == 2
    ran = [[name for _, name in suite.durations(tmp_path / "reports" / f"phase-{i}.xml")]
           for i in (1, 2)]
    assert ran == [["test_x.py::test_fails"], ["test_x.py::test_alone"]]


def test_the_suite_marks_only_wall_clock_comparisons_alone():
    """The alone phase stays short: the tests that compare one wall-clock time with another."""
    marked = [node.name for path in sorted((ROOT / "tests").glob("test_*.py"))
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.FunctionDef)
              and "pytest.mark.alone" in [ast.unparse(d) for d in node.decorator_list]]
    assert 5 <= len(marked) <= 12, marked
    assert "test_warm_cache_reaches_the_first_image_5x_sooner_and_artifacts_load" in marked
    assert "test_two_processes_give_at_least_1_5x_the_images_per_second" in marked


def test_each_module_runs_in_one_worker_in_order_and_each_notebook_apart(tmp_path):
    """Under `make test`'s xdist options, with this suite's conftest: a module's tests share one
    worker and run in their order (test_readme's lines build on each other), while the notebook
    smoke runs spread over both workers."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: x\n    alone: x\n")
    log = tmp_path / "log"
    record = ("import os, pytest\n"
              "def _log(name):\n"
              f"    open({str(log)!r}, 'a').write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n")
    (tmp_path / "test_steps.py").write_text(record + "".join(
        f"def test_{i}():\n    _log('steps{i}')\n" for i in range(6)))
    (tmp_path / "test_other.py").write_text(record + "".join(
        f"def test_{i}():\n    _log('other{i}')\n" for i in range(6)))
    (tmp_path / "test_books.py").write_text(record + (
        "@pytest.mark.slow\n@pytest.mark.parametrize('n', range(6))\n"
        "def test_notebook_runs_in_smoke_mode(n):\n    import time; time.sleep(0.3); _log(f'book{n}')\n"))
    if not suite.workers():
        pytest.skip("one core: make test runs without xdist")
    (_, first), _ = suite.phases([])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *first[:5]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    for module in ("steps", "other"):
        mine = [(name, worker) for name, worker in lines if name.startswith(module)]
        assert [name for name, _ in mine] == [f"{module}{i}" for i in range(6)]
        assert len({worker for _, worker in mine}) == 1, mine
    assert len({worker for name, worker in lines if name.startswith("book")}) == 2, lines
