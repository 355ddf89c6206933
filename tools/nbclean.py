"""The course's notebooks committed without what running them adds, while the participant's file
keeps it. .gitattributes sends notebooks/*.ipynb through git's clean filter fastdiff-notebook,
which `make lab` (or `make nbfilter`) defines in the clone as this file: `git add` stores a
notebook without outputs, execution counts and widget state, and `git diff` compares through it,
so only edits of the cells' sources show and are committed; the file on disk keeps every output.
`make lab` adds the post-save hook below, so `git status` stays clean as well.

The filter runs as `python3 tools/nbclean.py`, on the standard library alone
(no .venv needed), from the top of the work tree (git's setup.c `setup_discovered_git_dir` leaves
git there and convert.c `apply_single_file_filter` starts the command without changing it). It
writes what JupyterLab writes (nbformat/v4/nbjson.py `JSONWriter.writes`: indent 1, sorted keys,
no ASCII escapes; nbformat.write adds the final newline), so a notebook that was only run cleans
back to its committed bytes. `python3 tools/nbclean.py < in.ipynb > out.ipynb`
cleans a file the same way. Introduced by `make lab` (README, "Editing a notebook")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# accelerator and colab.gpuType: the GPU Colab opens the notebook on (tools/lessons.py)
KEEP_NOTEBOOK = ("kernelspec", "language_info", "accelerator", "colab")
KEEP_COLAB = ("gpuType",)
KEEP_CELL = ("tags",)


def clean_notebook(nb: Any) -> Any:
    """Strip, in place, what running and saving add: outputs, execution counts, notebook
    metadata but kernelspec, language_info and the GPU Colab opens it on (accelerator,
    colab.gpuType: Colab's own provenance goes), cell metadata but tags (test_notebooks.py
    holds the committed notebooks to the same rule)."""
    nb["metadata"] = {k: v for k, v in nb["metadata"].items() if k in KEEP_NOTEBOOK}
    if isinstance(nb["metadata"].get("colab"), dict):
        nb["metadata"]["colab"] = {k: v for k, v in nb["metadata"]["colab"].items()
                                   if k in KEEP_COLAB}
    for cell in nb["cells"]:
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL}
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def clean_text(text: str) -> str:
    """The notebook JSON `text`, cleaned and written as JupyterLab writes a notebook."""
    nb = json.loads(text)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) \
            or not isinstance(nb.get("metadata"), dict):
        raise ValueError("it is JSON but not a notebook (no 'cells' list or 'metadata')")
    return json.dumps(clean_notebook(nb), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def post_save(model: dict, os_path: str, contents_manager: Any = None, **kwargs: Any) -> None:
    """jupyter_server's ContentsManager.post_save_hook (`make lab`): when a saved notebook, as
    git stores it (through the filter), equals what git's index holds, the index records the
    file's new size and time, as `git add` would, staging nothing. git status lists a file whose
    size differs from the recorded one as modified without reading it (read-cache.c
    `ie_modified`), and outputs change the size; so without this every run notebook would be
    listed, with an empty `git diff`. A notebook whose cells were edited is left as it is. Never
    raises: the file is saved already, and an error here would report the save as failed."""
    if model.get("type") != "notebook":
        return
    folder, name = os.path.split(os.path.abspath(os_path))

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True,
                                  timeout=120)
        except (OSError, subprocess.SubprocessError):  # no git; a filter that hangs
            return None
        return done.stdout if done.returncode == 0 else None

    staged = (git("ls-files", "--stage", "--", name) or "").split()  # mode blob stage path
    if len(staged) < 4 or staged[2] != "0":
        return  # not in a git work tree, not tracked, or in a merge conflict
    if (git("hash-object", "--path", name, "--", name) or "").strip() == staged[1]:
        git("update-index", "-q", "--", name)


def main() -> int:
    """stdin -> stdout, as UTF-8 whatever the locale (git may run the filter under LANG=C)."""
    try:
        cleaned = clean_text(sys.stdin.buffer.read().decode("utf-8"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # bad JSON, UTF-8 or cells
        sys.stderr.write(
            f"fastdiff nbclean: this notebook cannot be cleaned ({type(e).__name__}: {e}), so git "
            "refuses to store it. Open it in JupyterLab (or resolve the merge-conflict markers in "
            "it), save it, and run the git command again.\n")
        return 1
    sys.stdout.buffer.write(cleaned.encode("utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
