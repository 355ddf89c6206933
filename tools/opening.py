"""How a notebook opens where a participant is: its first cell (FIRST_CELL, which runs
fastdiff_helpers/course/hosted.py where the course is not installed), the GPU
Colab gives it (its metadata), and its Open-in-Colab and Open-in-Kaggle badges (the README's
syllabus). `.venv/bin/python -m tools.lessons --write` writes all three (tools/lessons.py).
Introduced in docs/hosted.md."""

from __future__ import annotations

import functools
import importlib.metadata as metadata

from fastdiff_helpers.course.planning.gpus import PROFILES
from fastdiff_helpers.course.planning.plan import plan
from fastdiff_helpers.course import hosted

# The GPU Colab opens each notebook on (its metadata: accelerator, colab.gpuType): the cheapest
# card Colab offers whose plan (course/planning/plan.py) runs the lesson; a lesson about fp8 needs a
# card that does not skip fp8.
COLAB_CARDS = (("T4", "t4"), ("L4", "l4"), ("A100", "a100-40"))  # (Colab's name, profile)
FP8_LESSONS = ("15",)
BRANCH = "main"  # the branch the Open-in badges open
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
SETUP_CELL_ID = "setup"

FIRST_CELL = '''\
# The first cell of every notebook (docs/hosted.md). Where fastdiff_helpers imports (the course's
# .venv, `make lab`), it only imports it. Anywhere else (Colab, Kaggle, another Jupyter) it first
# installs it with %pip: it checks the host, keeps the host's torch, numpy, ipython, ipykernel and
# ipywidgets as they are, and says in one line whether the kernel must restart.
import importlib.util, os, runpy, sys
if importlib.util.find_spec("fastdiff_helpers") is None:
    source = os.environ.get("FASTDIFF_SOURCE") or "git+{repository}"
    %pip install --quiet --no-deps {{source}}
    importlib.invalidate_caches()
    found = importlib.util.find_spec("fastdiff_helpers")
    if found is None:
        sys.exit(f"fastdiff: pip could not get {{source}} (see above). No internet? Kaggle: Session options > Internet on.")
    host = runpy.run_path(found.submodule_search_locations[0] + "/course/hosted.py")
    requirements = host["prepare"]()  # the host's limits, said in one line; what to install
    %pip install --quiet {{requirements}}
    host["finish"]()
import fastdiff_helpers as fdh
'''


def first_cell(repository: str | None = None) -> str:
    """FIRST_CELL with the repository's address (default: pyproject's [project.urls] Repository,
    as the installed package's metadata carries it)."""
    return FIRST_CELL.format(repository=repository or repository_url()).rstrip("\n")


def repository_url() -> str:
    """The repository's address: [project.urls] Repository in pyproject.toml, read from the
    installed package's metadata (Project-URL), so a clone's .venv and an install agree."""
    for entry in metadata.metadata(hosted.PACKAGE).get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip().rstrip("/")
    raise LookupError(f"{hosted.PACKAGE}'s metadata has no Project-URL 'Repository': "
                      "reinstall it (make venv) after pyproject.toml's [project.urls] says it")


@functools.lru_cache(maxsize=1)
def colab_gpus() -> dict[str, str]:
    """{notebook: the GPU Colab opens it on}: the first of COLAB_CARDS whose plan does not skip
    the notebook (nor, for a lesson about fp8, its fp8 work)."""
    rows = {card: {row["notebook"]: row for row in plan(PROFILES[key])}
            for card, key in COLAB_CARDS}

    def serves(row: dict) -> bool:
        return row["verdict"] != "skipped" and not (
            row["notebook"][:2] in FP8_LESSONS and any("fp8" in why for why in row["skipped"]))
    return {name: next((card for card, _ in COLAB_CARDS if serves(rows[card][name])),
                       COLAB_CARDS[-1][0]) for name in rows["T4"]}


def colab_gpu(name: str) -> str:
    """The GPU Colab opens the notebook `name` on (colab_gpus)."""
    return colab_gpus()[name]


def badges(name: str, repository: str | None = None) -> str:
    """The notebook's Open-in-Colab and Open-in-Kaggle badges, linked into the repository
    (pyproject.toml's [project.urls] Repository)."""
    repo = repository or repository_url()
    on_github = f"{repo}/blob/{BRANCH}/notebooks/{name}"
    colab = "https://colab.research.google.com/github/" + on_github.split("github.com/", 1)[1]
    return (f"[![Open in Colab]({COLAB_BADGE})]({colab}) "
            f"[![Open in Kaggle]({KAGGLE_BADGE})](https://kaggle.com/kernels/welcome?src="
            f"{on_github})")


def cell_text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def with_first_cell(nb: dict, cell_source: str, gpu: str) -> dict:
    """The notebook with the first cell (first_cell) as its first code cell, without
    the import it now makes in the parameters cell, and Colab's GPU in its metadata."""
    nb["metadata"]["accelerator"] = "GPU"
    nb["metadata"]["colab"] = {"gpuType": gpu}
    code = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    lines = cell_source.splitlines(keepends=True)
    if code and nb["cells"][code[0]].get("id") == SETUP_CELL_ID:
        nb["cells"][code[0]]["source"] = lines
        return nb
    for i in code[:1]:
        params = nb["cells"][i]
        kept = [line for line in cell_text(params).split("\n")
                if line != "import fastdiff_helpers as fdh"]
        params["source"] = "\n".join(kept).splitlines(keepends=True)
    nb["cells"].insert(code[0] if code else len(nb["cells"]), {
        "cell_type": "code", "execution_count": None, "id": SETUP_CELL_ID, "metadata": {},
        "outputs": [], "source": lines})
    return nb
