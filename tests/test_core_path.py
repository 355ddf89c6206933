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
from fastdiff_helpers.course import lessons as L
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
    from fastdiff_helpers.course import settings as S
    from fastdiff_helpers.techniques.tuning_state import STATE

    fdh.course_settings("sdxl", smoke=True)
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
