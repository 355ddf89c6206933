"""The notebooks: committed clean, GPU cells guarded, listed in the README, and executed.

The slow test executes every notebook in smoke mode (FASTDIFF_SMOKE=1: tiny weights, CPU) on a
copy, and keeps the executed copies under out/notebooks/ (gitignored) as CI artifacts.
"""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXECUTED_DIR = ROOT / "out" / "notebooks"
CELL_TIMEOUT_S = 900


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _ids(paths):
    return [p.name for p in paths]


def _code_cells(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "00_setup.ipynb" in names and "08_all_models.ipynb" in names, names


# --- fast checks of the committed files ---------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_clean(path):
    """No outputs, no execution counts, no widget state: notebooks are committed clean."""
    nb = _read(path)
    problems = []
    for i, cell in _code_cells(nb):
        if cell.get("outputs"):
            problems.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has execution_count {cell['execution_count']}")
    if "widgets" in nb.metadata:
        problems.append("metadata.widgets is present (saved widget state)")
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append(f"kernelspec is {nb.metadata.get('kernelspec')}, not python3")
    assert not problems, (f"{path.name}: " + "; ".join(problems) + ". Clear the outputs "
                          "(Edit > Clear Outputs of All Cells, or `jupyter nbconvert "
                          "--clear-output --inplace`) and drop metadata.widgets before committing.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_gpu_cells_are_guarded(path):
    """Every cell tagged "gpu" starts with `if fdh.needs_gpu(...)` (prints why on a CPU)."""
    nb = _read(path)
    bad = [i for i, cell in _code_cells(nb) if "gpu" in cell.metadata.get("tags", [])
           and not re.search(r"^if fdh\.needs_gpu\(", cell.source, re.M)]
    assert not bad, f"{path.name}: gpu-tagged cells {bad} do not call fdh.needs_gpu(...)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_needs_gpu_cells_are_tagged(path):
    """The reverse: a cell that calls fdh.needs_gpu is tagged "gpu", so tools can find it."""
    nb = _read(path)
    bad = [i for i, cell in _code_cells(nb) if "fdh.needs_gpu(" in cell.source
           and "gpu" not in cell.metadata.get("tags", [])]
    assert not bad, f"{path.name}: cells {bad} call fdh.needs_gpu but are not tagged 'gpu'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_parses_and_defines_no_helpers(path):
    """Every code cell is valid Python, and notebooks define no functions or classes: every
    real operation is an fdh call (lambdas for a filter are fine)."""
    nb = _read(path)
    problems = []
    for i, cell in _code_cells(nb):
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("%", "!")))  # IPython magics
        try:
            tree = ast.parse(source)
        except SyntaxError as err:
            problems.append(f"cell {i}: {err}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                problems.append(f"cell {i} defines {node.name!r}: move it into fastdiff_helpers")
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_readme_links_every_notebook():
    """The README's syllabus links every notebook (notebooks/NN_name.ipynb)."""
    readme = ROOT / "README.md"
    assert readme.exists(), "README.md is missing; it must hold the syllabus linking every notebook"
    text = readme.read_text(encoding="utf-8")
    targets = {re.sub(r"^\./", "", t.split("#")[0]) for t in re.findall(r"\]\(\s*<?([^)\s>]+)", text)}
    missing = [p.name for p in NOTEBOOKS if f"notebooks/{p.name}" not in targets]
    assert not missing, f"README.md has no link to: {', '.join(missing)}"


# --- the slow check: execute every notebook in smoke mode ---------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_in_smoke_mode(path, monkeypatch):
    """Execute a copy on the tiny model (FASTDIFF_SMOKE=1, CPU, offline); no cell may error."""
    from nbclient import NotebookClient

    for name, value in {"FASTDIFF_SMOKE": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                        "MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}.items():
        monkeypatch.setenv(name, value)
    nb = _read(path)  # a copy in memory: the committed file is never written
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        seconds = time.perf_counter() - start
        EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, EXECUTED_DIR / path.name)
        timings = EXECUTED_DIR / "timings.json"
        recorded = json.loads(timings.read_text()) if timings.exists() else {}
        recorded[path.name] = round(seconds, 1)
        timings.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    errors = []
    for i, cell in _code_cells(nb):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first_line = cell.source.splitlines()[0] if cell.source else ""
                errors.append(f"cell {i} ({first_line[:60]!r}): {out.get('ename')}: "
                              f"{out.get('evalue', '')[:300]}")
    assert not errors, (f"{path.name} ({seconds:.0f} s): " + "\n".join(errors)
                        + f"\nExecuted copy: {EXECUTED_DIR / path.name}")
