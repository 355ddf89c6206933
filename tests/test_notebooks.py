"""The notebooks: committed clean with stable cell ids, following the course skeleton, GPU cells
guarded, listed in the README, and executed. The notebooks are the source (edited in JupyterLab);
these tests hold what a generator used to guarantee.

The slow test executes every notebook in smoke mode (FASTDIFF_SMOKE=1: tiny weights, CPU) on a
copy, and keeps the executed copies under out/notebooks/ (gitignored) as CI artifacts.
"""

from __future__ import annotations

import ast
import fcntl
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from tools.opening import first_cell  # noqa: E402
from tools.nbclean import KEEP_CELL, KEEP_COLAB, KEEP_NOTEBOOK  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXECUTED_DIR = ROOT / "out" / "notebooks"
CLOCK_DIR = ROOT / "out" / "clock"
CELL_TIMEOUT_S = 900


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _ids(paths):
    return [p.name for p in paths]


def _code_cells(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "00_setup.ipynb" in names and "17_all_models.ipynb" in names, names


# --- fast checks of the committed files ---------------------------------------------------

def _raw(path: Path) -> dict:
    """The file as JSON, as committed: nbformat.read may fill in what the file lacks (ids)."""
    return json.loads(path.read_text(encoding="utf-8"))


def as_stored(path: Path, root: Path = ROOT) -> dict:
    """The notebook as the next commit stores it: git's index where the file is tracked (`make
    lab`'s filter keeps a run notebook's outputs in the file alone), else the file."""
    try:
        done = subprocess.run(["git", "show", f":{path.relative_to(root).as_posix()}"], cwd=root,
                              capture_output=True, encoding="utf-8", timeout=60)
    except OSError:  # no git: a copy of the course without its history
        return _raw(path)
    return json.loads(done.stdout) if done.returncode == 0 else _raw(path)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _headings(nb, level: str = "## ") -> list[str]:
    """Markdown headings of one level, in order, outside fenced code blocks."""
    found, fenced = [], False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith(level):
                found.append(line.strip())
        fenced = False
    return found


def _calls(source: str, name: str) -> bool:
    """True when `source` calls fdh.<name>(...), `name` dotted for the course layer
    ("course.settings": fdh.course.settings(...)) (IPython magics skipped)."""
    try:
        tree = ast.parse("\n".join(line for line in source.splitlines()
                                   if not line.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return False  # test_code_parses_and_defines_no_helpers names the error
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) == f"fdh.{name}"
               for n in ast.walk(tree))


NB_METADATA = set(KEEP_NOTEBOOK)
CELL_METADATA = set(KEEP_CELL)
ENDING = ["## Try it yourself", "## Exercises", "## Summary"]
CELL_ID = re.compile(r"[a-z0-9-]+")


def clean_problems(raw: dict) -> list[str]:
    """What nbstripout would strip: outputs, execution counts, widget state and any notebook
    or cell metadata beyond kernelspec/language_info, Colab's GPU (accelerator,
    colab.gpuType) and tags."""
    problems = []
    extra = sorted(set(raw.get("metadata", {})) - NB_METADATA)
    if extra:
        problems.append(f"notebook metadata has {extra} (widget state, jupytext, ...): keep only "
                        f"{sorted(NB_METADATA)}")
    colab = sorted(set(raw.get("metadata", {}).get("colab") or {}) - set(KEEP_COLAB))
    if colab:
        problems.append(f"notebook metadata colab has {colab}: keep only {list(KEEP_COLAB)}")
    if raw.get("metadata", {}).get("kernelspec", {}).get("name") != "python3":
        problems.append(f"kernelspec is {raw.get('metadata', {}).get('kernelspec')}, not python3")
    for i, cell in enumerate(raw.get("cells", [])):
        if cell.get("outputs"):
            problems.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has execution_count {cell['execution_count']}")
        extra = sorted(set(cell.get("metadata", {})) - CELL_METADATA)
        if extra:
            problems.append(f"cell {i} metadata has {extra}: keep only tags")
    return problems


def id_problems(raw: dict) -> list[str]:
    """Every cell has an id, unique in the notebook, of lower-case letters, digits and '-'."""
    problems, seen = [], set()
    if (raw.get("nbformat"), raw.get("nbformat_minor", 0)) < (4, 5):
        problems.append(f"nbformat {raw.get('nbformat')}.{raw.get('nbformat_minor')} has no "
                        "cell ids: save it with JupyterLab (nbformat 4.5+)")
    for i, cell in enumerate(raw.get("cells", [])):
        cell_id = cell.get("id")
        if not cell_id:
            problems.append(f"cell {i} has no id")
        elif not CELL_ID.fullmatch(cell_id):
            problems.append(f"cell {i} id {cell_id!r} is not [a-z0-9-]+")
        elif cell_id in seen:
            problems.append(f"cell {i} id {cell_id!r} is used twice")
        seen.add(cell_id)
    return problems


def skeleton_problems(nb, number: str) -> list[str]:
    """The course skeleton: a "# NN · title" markdown cell with a "**What you will learn**" list
    first; the first cell of every notebook (course/hosted.py: it imports fastdiff_helpers as
    fdh, installing it where it is missing) is the first code cell, the parameters cell
    (fdh.course.settings) the second; the headings end
    "## Try it yourself", "## Exercises", "## Summary", in that order."""
    problems = []
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown":
        problems.append("the first cell is not markdown")
    else:
        lines = first.source.splitlines()
        if not lines or not re.fullmatch(rf"# {number} · \S.*", lines[0]):
            problems.append(f"the first cell does not start with the title '# {number} · ...'"
                            f" (it starts {lines[0][:60] if lines else ''!r})")
        if "**What you will learn**" not in lines:
            problems.append("the first cell has no '**What you will learn**' line")
        else:
            after = lines[lines.index("**What you will learn**") + 1:]
            if not after or not after[0].startswith("- "):
                problems.append("'**What you will learn**' is not followed by a '- ' list")
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(code) < 2:
        problems.append("there is no first cell and parameters cell")
    else:
        if code[0].source != first_cell():
            problems.append("the first code cell is not the first cell of every notebook "
                            "(tools/opening.py FIRST_CELL): run `.venv/bin/python -m "
                            "tools.lessons --write`")
        if not _calls(code[1].source, "course.settings"):
            problems.append("the second code cell is not the parameters cell: it must call "
                            "fdh.course.settings(...)")
    headings = _headings(nb)
    for heading in ENDING:
        if headings.count(heading) != 1:
            problems.append(f"{heading!r} appears {headings.count(heading)} times, not once")
    if all(headings.count(h) == 1 for h in ENDING):
        if headings[-3:] != ENDING:
            problems.append(f"the last headings are {headings[-3:]}, not {ENDING}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_clean(path):
    """Clean the way nbstripout leaves a notebook: no outputs, no execution counts, no widget
    state, notebook metadata only kernelspec and language_info, cell metadata only tags. In CI
    the index is the commit: this fails on a notebook committed with outputs from a clone
    without the filter (tests/test_nbclean.py)."""
    problems = clean_problems(as_stored(path))
    assert not problems, (f"{path.name}: " + "; ".join(problems) + ". Clear the outputs "
                          "(Edit > Clear Outputs of All Cells, or `jupyter nbconvert "
                          "--clear-output --inplace`) and drop the extra metadata before "
                          "committing (README.md, 'Editing a notebook').")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_cell_ids_are_stable(path):
    """Every cell has an id, unique within the notebook, matching [a-z0-9-]+. Ids are never
    renumbered: a diff then shows the cells that changed, not every cell after an insertion."""
    problems = id_problems(_raw(path))
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_skeleton(path):
    """What you will learn -> parameters cell -> ... -> Try it yourself -> Exercises -> Summary."""
    problems = skeleton_problems(_read(path), path.name[:2])
    assert not problems, f"{path.name}: " + "; ".join(problems) + " (STYLE.md, the skeleton)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_reference_numbers_are_one_call(path):
    """The code cell under '## Compare with the reference numbers' is fdh.course.reference_numbers,
    and no notebook calls the retired Recipe.to_code method (fdh.to_code(recipe) instead)."""
    nb = _read(path)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and cell.source.startswith(
                "## Compare with the reference numbers"):
            following = next((c for c in nb.cells[i + 1:] if c.cell_type == "code"), None)
            if following is None or not _calls(following.source, "course.reference_numbers"):
                problems.append(f"the code cell after cell {i} does not call "
                                "fdh.course.reference_numbers(settings.model)")
        if re.search(r"(?<!\bfdh)\.to_code\(", cell.source):
            problems.append(f"cell {i} calls the retired .to_code method: use fdh.to_code(recipe)")
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_gpu_cells_are_guarded(path):
    """Every cell tagged "gpu" starts with `if fdh.course.needs_gpu(...)` (prints why on a CPU)."""
    nb = _read(path)
    bad = [i for i, cell in _code_cells(nb) if "gpu" in cell.metadata.get("tags", [])
           and not re.search(r"^if fdh\.course\.needs_gpu\(", cell.source, re.M)]
    assert not bad, f"{path.name}: gpu-tagged cells {bad} do not call fdh.course.needs_gpu(...)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_needs_gpu_cells_are_tagged(path):
    """The reverse: a cell that calls fdh.course.needs_gpu is tagged "gpu", so tools can find it."""
    nb = _read(path)
    bad = [i for i, cell in _code_cells(nb) if "fdh.course.needs_gpu(" in cell.source
           and "gpu" not in cell.metadata.get("tags", [])]
    assert not bad, f"{path.name}: cells {bad} call fdh.course.needs_gpu but are not tagged 'gpu'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_parses_and_defines_no_helpers(path):
    """Every code cell is valid Python, and notebooks define no functions or classes: every
    real operation is an fdh call (lambdas for a filter are fine). The exception is a cell
    tagged "technique": the course's own technique written out in plain code on the page,
    which tests/test_plain_cells.py runs against fdh.apply (issue 59)."""
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
        plain = "technique" in cell.metadata.get("tags", [])
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) or (
                    isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not plain):
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

    # the course clock's record of this run (fastdiff_helpers/course/planning/clock.py): what each
    # cell loads, compiles and calls, checked below against the committed record
    CLOCK_DIR.mkdir(parents=True, exist_ok=True)
    log = CLOCK_DIR / f"{path.stem}.jsonl"
    log.unlink(missing_ok=True)
    for name, value in {"FASTDIFF_SMOKE": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                        "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
                        "FASTDIFF_CLOCK_LOG": str(log),
                        # the rungs the core lessons keep for 10's chart (course/day.py)
                        "FASTDIFF_DAY_DIR": str(ROOT / "out" / "day-smoke")}.items():
        monkeypatch.setenv(name, value)
    nb = _read(path)  # a copy in memory: the committed file is never written

    def mark(cell, cell_index, **_):  # before the kernel runs the cell: its events follow
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": "cell", "id": cell.get("id")}) + "\n")

    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
                            on_cell_execute=mark)
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        seconds = time.perf_counter() - start
        EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, EXECUTED_DIR / path.name)
        timings = EXECUTED_DIR / "timings.json"
        with open(EXECUTED_DIR / "timings.lock", "w") as lock:  # xdist: workers write it too
            fcntl.flock(lock, fcntl.LOCK_EX)
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
    from fastdiff_helpers.course.planning import clock, clock_record

    recorded = clock.summarize(clock.read_log(log))
    assert recorded == clock_record.RECORDED.get(path.name, {}), (
        f"{path.name} loads, compiles or calls other than the course clock's record says: after "
        "make test, refresh it with `.venv/bin/python -m tools.clock_refresh "
        f"out/clock` and read the diff (what changed, and its estimate in docs/workshop.md)")
