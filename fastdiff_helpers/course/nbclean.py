"""The course's notebooks, saved the way the course commits them: `make lab` gives JupyterLab's
server this pre-save hook, so running a notebook and saving it (JupyterLab autosaves every two
minutes) writes no outputs, execution counts or extra metadata into the file, and `git status`
stays clean. The outputs stay in the open notebook; a copy saved under another name keeps them.

Only the course's own notebooks (NN_name.ipynb at the top of the folder JupyterLab serves) are
cleaned. Introduced by `make lab` (README, "Editing a notebook"); `python -m
fastdiff_helpers.nbclean < in.ipynb > out.ipynb` cleans a file the same way."""

from __future__ import annotations

import re
import sys
from typing import Any

KEEP_NOTEBOOK = ("kernelspec", "language_info")
KEEP_CELL = ("tags",)
COURSE_NOTEBOOK = re.compile(r"^\d\d_\w+\.ipynb$")


def clean_notebook(nb: Any) -> Any:
    """Strip, in place, what running and saving add: outputs, execution counts, notebook
    metadata but kernelspec and language_info, cell metadata but tags (test_notebooks.py
    holds the committed notebooks to the same rule)."""
    nb["metadata"] = {k: v for k, v in nb["metadata"].items() if k in KEEP_NOTEBOOK}
    for cell in nb["cells"]:
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL}
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def pre_save(model: dict, path: str, contents_manager: Any = None, **kwargs: Any) -> None:
    """jupyter_server's ContentsManager.pre_save_hook: a course notebook is saved clean."""
    if model.get("type") == "notebook" and COURSE_NOTEBOOK.match(path.strip("/")):
        clean_notebook(model["content"])


def main() -> int:
    import nbformat

    nb = nbformat.reads(sys.stdin.read(), as_version=nbformat.NO_CONVERT)
    sys.stdout.write(nbformat.writes(clean_notebook(nb)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
