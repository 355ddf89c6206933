"""The participant's work kept (issue 46, item 5): a notebook run and saved in `make lab` keeps its
outputs in its file, and git stores it clean through the filter .gitattributes names and the
Makefile's `nbfilter` defines (tools/nbclean.py). The git tests work in a
temporary clone-like repository with the project's Makefile, .gitattributes and cleaner, the
filter defined by `make nbfilter` as `make lab` defines it; notebooks are saved with nbformat.write,
the call jupyter_server's FileContentsManager saves with (services/contents/fileio.py
`_save_notebook`). tests/test_notebooks.py::test_committed_clean is the check at commit time for a
clone without the filter: it fails in CI on a notebook committed with outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import nbclean

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CLEANER = Path("tools", "nbclean.py")
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None,
                                reason="needs git and make")


def git(repo: Path, *args: str, check: bool = True, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV, HOME=str(repo.parent))  # no global config of the machine's user
    done = subprocess.run(["git", *args], cwd=cwd or repo, env=env, capture_output=True,
                          text=True, timeout=120)
    assert not check or done.returncode == 0, done.stderr
    return done


def course_clone(tmp_path: Path, names=("00_setup.ipynb", "04_torch_compile.ipynb")) -> Path:
    """A committed repository with the project's Makefile, .gitattributes, .gitignore, cleaner
    and the notebooks `names`, the filter defined by `make nbfilter`."""
    repo = tmp_path / "clone"
    (repo / CLEANER.parent).mkdir(parents=True)
    (repo / "notebooks").mkdir()
    for path in ("Makefile", ".gitattributes", ".gitignore", CLEANER):
        shutil.copy(ROOT / path, repo / path)
    for name in names:
        shutil.copy(ROOT / "notebooks" / name, repo / "notebooks" / name)
    git(repo, "init", "-q")
    made = subprocess.run(["make", "-s", "nbfilter"], cwd=repo, capture_output=True, text=True)
    assert made.returncode == 0 and "git now stores" in made.stdout, made.stdout + made.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "course")
    return repo


def run_and_save(path: Path, source_edit: str = "") -> None:
    """What running and saving in JupyterLab writes: outputs, a count, widget state."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code[0].execution_count = 1
    code[0].metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata["colab"]["provenance"] = []  # as a save on Colab adds
    nb.cells[0].source += source_edit
    nbformat.write(nb, path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_a_committed_notebook_is_what_the_filter_and_jupyterlab_write(path):
    """Else a notebook that was only run reads as modified: the filter's output (or a JupyterLab
    save) differs from the committed bytes in key order or escapes."""
    committed = path.read_text(encoding="utf-8")
    assert nbclean.clean_text(committed) == committed, f"{path.name}: not in the saved format"
    assert nbformat.writes(nbformat.reads(committed, as_version=4)) + "\n" == committed


def test_the_filter_needs_only_the_standard_library_and_no_utf8_locale(tmp_path):
    """git runs the filter with the machine's python3 (no .venv) under whatever locale it has:
    -I -S leaves out site-packages and PYTHONPATH, LC_ALL=C makes stdout ASCII for text."""
    path = ROOT / "notebooks" / "00_setup.ipynb"
    committed = path.read_bytes()
    assert "·".encode() in committed  # a character that ASCII stdout could not write
    ran = tmp_path / path.name
    shutil.copy(path, ran)
    run_and_save(ran)
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run([sys.executable, "-I", "-S", str(ROOT / CLEANER)], input=ran.read_bytes(),
                          capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == committed


def test_a_run_notebook_keeps_its_outputs_and_git_stores_it_clean(tmp_path):
    repo = course_clone(tmp_path)
    path, rel = repo / "notebooks" / "00_setup.ipynb", "notebooks/00_setup.ipynb"
    committed = path.read_text(encoding="utf-8")
    run_and_save(path)
    assert "hello" in path.read_text(encoding="utf-8")  # the participant's file keeps it
    assert git(repo, "diff").stdout == ""
    assert git(repo, "show", f":{rel}").stdout == committed
    # git lists it by its new size alone (read-cache.c ie_modified); the post-save hook re-records
    assert git(repo, "status", "--porcelain").stdout == f" M {rel}\n"
    nbclean.post_save(model={"type": "notebook"}, os_path=str(path), contents_manager=None)
    assert git(repo, "status", "--porcelain").stdout == ""
    assert git(repo, "diff", "--cached").stdout == ""  # nothing staged
    assert "hello" in path.read_text(encoding="utf-8")


def test_an_edited_notebook_shows_and_commits_its_edit_without_outputs(tmp_path):
    repo = course_clone(tmp_path)
    path, rel = repo / "notebooks" / "04_torch_compile.ipynb", "notebooks/04_torch_compile.ipynb"
    run_and_save(path, source_edit="\nA line the participant wrote.")
    nbclean.post_save(model={"type": "notebook"}, os_path=str(path), contents_manager=None)
    assert git(repo, "status", "--porcelain").stdout == f" M {rel}\n"  # an edit is not hidden
    assert git(repo, "diff", "--cached").stdout == ""  # and not staged by the hook
    diff = git(repo, "diff").stdout
    assert '+    "A line the participant wrote."' in diff and "hello" not in diff
    git(repo, "add", "04_torch_compile.ipynb", cwd=repo / "notebooks")  # git add from a subfolder
    git(repo, "commit", "-qm", "edit")
    stored = json.loads(git(repo, "show", f"HEAD:{rel}").stdout)
    assert "A line the participant wrote." in "".join(stored["cells"][0]["source"])
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in stored["cells"] if c["cell_type"] == "code")
    assert set(stored["metadata"]) == {"kernelspec", "language_info", "accelerator", "colab"}
    assert stored["metadata"]["colab"] == {"gpuType": "T4"}  # Colab's provenance went
    assert all(set(c["metadata"]) <= {"tags"} for c in stored["cells"])
    assert "hello" in path.read_text(encoding="utf-8")


def test_a_pull_brings_a_changed_notebook_and_the_others_keep_their_outputs(tmp_path):
    """A required filter needs a smudge command too: without one every checkout of a notebook
    dies (convert.c apply_filter finds no command, and "smudge filter ... failed"). A notebook
    the course changed upstream comes as the new version (git saw nothing of the learner's to
    keep: README, "Editing a notebook"); the others keep their outputs."""
    upstream = course_clone(tmp_path)
    git(tmp_path, "clone", "-q", str(upstream), "learner")
    learner = tmp_path / "learner"
    made = subprocess.run(["make", "-s", "nbfilter"], cwd=learner, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    for name in ("00_setup.ipynb", "04_torch_compile.ipynb"):
        run_and_save(learner / "notebooks" / name)
        nbclean.post_save(model={"type": "notebook"}, os_path=str(learner / "notebooks" / name))
    changed = upstream / "notebooks" / "00_setup.ipynb"
    changed.write_text(changed.read_text(encoding="utf-8").replace(
        "What you will learn", "What you will learn here"), encoding="utf-8")
    git(upstream, "commit", "-qam", "a course fix")
    git(learner, "pull", "-q")
    assert git(learner, "status", "--porcelain").stdout == ""
    pulled = (learner / "notebooks" / "00_setup.ipynb").read_text(encoding="utf-8")
    assert "What you will learn here" in pulled and "hello" not in pulled
    assert "hello" in (learner / "notebooks" / "04_torch_compile.ipynb").read_text()
    git(learner, "checkout", "--", "notebooks/04_torch_compile.ipynb")  # checkout runs smudge


def test_a_notebook_the_filter_cannot_read_is_refused_not_stored(tmp_path):
    """filter.fastdiff-notebook.required: a failing filter stops `git add` (convert.c
    convert_to_git: "clean filter ... failed") instead of storing the file as it is."""
    repo = course_clone(tmp_path)
    path, rel = repo / "notebooks" / "00_setup.ipynb", "notebooks/00_setup.ipynb"
    before = git(repo, "rev-parse", f":{rel}").stdout
    path.write_text("<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> theirs\n", encoding="utf-8")
    added = git(repo, "add", rel, check=False)
    assert added.returncode != 0
    assert "clean filter 'fastdiff-notebook' failed" in added.stderr
    assert "resolve the merge-conflict markers" in added.stderr
    assert git(repo, "rev-parse", f":{rel}").stdout == before


def test_make_nbfilter_is_idempotent_and_only_at_the_top_of_a_work_tree(tmp_path):
    repo = course_clone(tmp_path)
    again = subprocess.run(["make", "-s", "nbfilter"], cwd=repo, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == ""
    for key in ("clean", "required"):
        values = git(repo, "config", "--get-all", f"filter.fastdiff-notebook.{key}").stdout
        assert len(values.splitlines()) == 1, values
    git(repo, "config", "--remove-section", "filter.fastdiff-notebook")
    plain = tmp_path / "download"  # a course folder that is no git work tree
    inside = repo / "vendored"  # or a folder inside another repository
    for folder in (plain, inside):
        folder.mkdir()
        shutil.copy(ROOT / "Makefile", folder / "Makefile")
        made = subprocess.run(["make", "-s", "nbfilter"], cwd=folder, capture_output=True,
                              text=True, env=dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path)))
        assert made.returncode == 0 and made.stdout == "", made.stderr
    assert not (plain / ".git").exists()
    assert git(repo, "config", "--get-regexp", "^filter\\.", check=False).stdout == ""


def test_the_post_save_hook_never_fails_a_save(tmp_path):
    """A save outside git, of a file that is no notebook, or with git failing, is left alone
    (jupyter_server reports an exception from a post-save hook as a failed save)."""
    loose = tmp_path / "loose" / "00_setup.ipynb"
    loose.parent.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", loose)
    for model in ({"type": "notebook"}, {"type": "file"}):
        assert nbclean.post_save(model=model, os_path=str(loose), contents_manager=None) is None
    repo = course_clone(tmp_path)
    path = repo / "notebooks" / "00_setup.ipynb"
    path.write_text("not json", encoding="utf-8")  # the filter fails: nothing recorded
    nbclean.post_save(model={"type": "notebook"}, os_path=str(path), contents_manager=None)
    assert git(repo, "status", "--porcelain").stdout == " M notebooks/00_setup.ipynb\n"


def test_the_commit_time_check_reads_what_git_stores(tmp_path):
    """test_notebooks.py::test_committed_clean checks the notebook as the next commit stores it:
    a run notebook's file has outputs, its index entry none; a file never added is read as is."""
    from test_notebooks import as_stored, clean_problems

    repo = course_clone(tmp_path)
    path = repo / "notebooks" / "00_setup.ipynb"
    run_and_save(path)
    assert clean_problems(json.loads(path.read_text(encoding="utf-8")))  # outputs in the file
    assert clean_problems(as_stored(path, root=repo)) == []
    new = repo / "notebooks" / "19_new.ipynb"
    shutil.copy(path, new)
    assert clean_problems(as_stored(new, root=repo))  # untracked: the file, outputs and all
