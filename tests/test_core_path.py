"""The core path as a participant meets it (issue 59): what the parameters cell says (the
versions the code was written for, nothing about autotuning or tuning bundles unless a bundle is
in use), one ladder with one name per rung, each technique taught before a notebook measures it.
Fast: the notebooks are read, not run (tests/test_notebooks.py runs them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fastdiff_helpers as fdh
from tools import lessons as L
from fastdiff_helpers.course.written_for import WRITTEN_FOR, written_for_line

ROOT = Path(__file__).resolve().parent.parent
CORE = [L.NOTEBOOKS / name for name in L.core_path()]


def test_the_versions_the_code_was_written_for_are_the_pins():
    pins = dict(line.strip().split("==") for line in
                (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert WRITTEN_FOR == {name: pins[name] for name in WRITTEN_FOR}


def test_the_versions_line_says_what_differs_here():
    same = written_for_line(dict(WRITTEN_FOR, torch="2.13.0+cu130"))
    assert same.startswith("fastdiff: the code on these pages was written for torch 2.13.0, "
                           "diffusers 0.42.1, torchao 0.18.0")
    assert same.endswith("; this machine has them")
    older = written_for_line(dict(WRITTEN_FOR, diffusers="0.35.2", peft="not installed"))
    assert older.endswith("; here: diffusers 0.35.2, peft not installed")


def test_the_parameters_cell_prints_the_versions_and_no_autotuning(capsys):
    from fastdiff_helpers.course import parameters as S
    from fastdiff_helpers.course.planning.tuning_state import STATE

    fdh.course.settings("sdxl", smoke=True)
    said = capsys.readouterr().out
    assert "the code on these pages was written for torch" in said
    before = set(STATE.roots)
    STATE.roots.clear()  # as a fresh process: the committed results/ not yet looked at
    try:
        S.import_course_tuning()  # on a GPU the parameters cell calls it; here no bundle matches
    finally:
        STATE.roots.clear()
        STATE.roots.update(before)
    said = capsys.readouterr().out
    assert not re.search(r"autotun|bundle|coordinate descent", said, re.I), said
# Words of the autotuning lesson (13): the core path says none of them in its visible text, its
# code or its printed strings (folds may: a comparison with the blog's max-autotune is one).
TUNING_WORDS = re.compile(r"autotun|tuning bundle|\bbundles?\b|coordinate.descent|coordesc",
                          re.I)


def _visible_and_code(path: Path) -> list[tuple[str, str]]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":  # what shows: the text, and each fold's title
            out.append((cell["id"], L.DETAILS.sub(" ", L.COMMENT.sub(" ", source))
                        + " ".join(L.SUMMARY.findall(source))))
        elif cell["id"] != "setup":  # the first cell of every notebook (course/hosted.py)
            out.append((cell["id"], source))
    return out


@pytest.mark.parametrize("path", CORE, ids=[p.name for p in CORE])
def test_the_core_path_says_no_word_of_autotuning(path):
    found = [f"{cell}: {m.group(0)!r}" for cell, text in _visible_and_code(path)
             for m in TUNING_WORDS.finditer(text)]
    assert not found, f"{path.name}: {found}"


def _code(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", CORE, ids=[p.name for p in CORE])
def test_the_core_path_runs_one_ladder_with_one_name_per_rung(path):
    """The blog's ladder stays out of the core path's code (lesson 17 runs it, folds quote it),
    and a step named like a rung of the course's ladder is that rung: the blog's names for
    other recipes ("fp32" with TF32 on) are not used."""
    code = _code(path)
    assert not re.search(r"fdh\.LADDER\b|ladder=\"blog\"", code), path.name
    steps = set(re.findall(r"step=\"([^\"]+)\"", code))
    assert not steps & {"fp32", "tf32", "sdpa-math"}, (path.name, steps)


def test_each_core_rung_is_kept_by_the_lesson_the_chart_names():
    """fdh.course.day_chart says which lesson keeps a rung not run: that lesson measures the rung under
    its name and keeps it (fdh.course.keep_rung)."""
    from fastdiff_helpers.course.day import KEPT_IN, OPTIONAL_RUNGS

    for rung, where in KEPT_IN.items():
        if rung in OPTIONAL_RUNGS:
            continue
        [path] = [p for p in CORE if p.name.startswith(where[:2])]
        code = _code(path)
        assert f'"{rung}"' in code and "fdh.course.keep_rung(" in code, (rung, path.name)


ALL = L.notebooks()


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_a_recent_spelling_comes_with_the_older_one_in_a_fold(path):
    """Issue 59, item 9: `from_pretrained(..., dtype=...)` is diffusers 0.42's spelling (the
    pinned one); a page that shows it says, folded, that older releases take `torch_dtype=`."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if re.search(r"from_pretrained\([^)]*\bdtype=torch", source, re.S):
            folds = " ".join(L.DETAILS.findall(source))
            assert "torch_dtype=" in folds, f"{path.name}:{cell['id']}: no fold on torch_dtype="
