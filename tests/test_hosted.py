"""Where participants open the notebooks (issue 57): every notebook's first cell installs the
package on Colab, Kaggle or any Jupyter, with the host's torch, numpy and Jupyter held; the
hosts' limits said in one line before anything slow; the package installed by pip from any
folder; Python 3.13.

The slow test is a hosted-notebook stand-in: a venv with torch 2.13 and Colab's older packages
(ipywidgets 7.7.1, ipykernel 6.17.1, ipython 7.34.0, diffusers 0.39.0, ...), kept under
out/hosted-standin/ between runs, where two notebooks copied alone into an empty folder run top
to bottom with nbclient, installing the package from FASTDIFF_SOURCE."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course import hosted
from tools import opening
from fastdiff_helpers.errors import FastdiffError
from fastdiff_helpers.models import hub

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


# --- the first cell, its one source, the badges -------------------------------------------------

def test_the_first_cell_is_short_says_what_it_does_and_reads_the_repository_once():
    cell = opening.first_cell()
    lines = cell.splitlines()
    comments = [line for line in lines if line.startswith("#")]
    assert len(lines) - len(comments) <= 13 and 2 <= len(comments) <= 4, cell
    assert "restart" in " ".join(comments) and "torch" in " ".join(comments)
    # the address is pyproject's, through the installed metadata (a stale .venv would differ)
    assert opening.repository_url() == REPOSITORY.rstrip("/")
    assert f'"git+{REPOSITORY}"' in cell and cell.count("github.com") == 1
    assert 'os.environ.get("FASTDIFF_SOURCE")' in cell
    assert cell.rstrip().endswith("import fastdiff_helpers as fdh")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_notebook_opens_with_the_cell_and_asks_colab_for_its_gpu(path):
    nb = _nb(path)
    code = _code(nb)
    assert code[0] == opening.first_cell(), (
        f"{path.name}: its first code cell is not opening.FIRST_CELL: run `.venv/bin/python -m "
        "tools.lessons --write`")
    assert "fdh.course.settings(" in code[1] and "import fastdiff_helpers" not in code[1]
    assert nb["metadata"]["accelerator"] == "GPU"
    assert nb["metadata"]["colab"] == {"gpuType": opening.colab_gpu(path.name)}


def test_a_changed_first_cell_is_caught_and_rewritten(tmp_path):
    """The copies cannot drift: lessons --write puts the one source back into a notebook whose
    first cell was edited, and the check above then holds (it failed on the edit)."""
    nb = _nb(NOTEBOOKS[1])
    nb["cells"][[i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"][0]][
        "source"] = ["import fastdiff_helpers as fdh\n"]
    assert _code(nb)[0] != opening.first_cell()
    fixed = opening.with_first_cell(nb, opening.first_cell(), "T4")
    assert _code(fixed)[0] == opening.first_cell()
    assert len(_code(fixed)) == len(_code(_nb(NOTEBOOKS[1])))  # rewritten, not added twice


def test_colab_opens_each_notebook_on_the_cheapest_card_its_plan_runs_it_on():
    """A T4 (Colab's free card) unless the plan skips the lesson there: 12 (fp8 needs
    compute capability 8.9) asks for an L4; 18 (Flux, an est. 37.9 GiB peak) for an A100, as
    an L4's 22.4 GiB does not hold it either."""
    from fastdiff_helpers.course.planning.gpus import PROFILES
    from fastdiff_helpers.course.planning.plan import plan

    gpus = opening.colab_gpus()
    assert {name: gpu for name, gpu in gpus.items() if gpu != "T4"} == {
        "15_fp8_hopper.ipynb": "L4", "19_flux.ipynb": "A100"}
    assert set(gpus) == {p.name for p in NOTEBOOKS}
    t4 = {row["notebook"]: row for row in plan(PROFILES["t4"])}
    l4 = {row["notebook"]: row for row in plan(PROFILES["l4"])}
    assert any("fp8" in why for why in t4["15_fp8_hopper.ipynb"]["skipped"])
    assert t4["19_flux.ipynb"]["verdict"] == l4["19_flux.ipynb"]["verdict"] == "skipped"
    assert all(t4[name]["verdict"] != "skipped" for name, gpu in gpus.items() if gpu == "T4")


def test_the_readme_has_both_badges_for_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        row = next(line for line in readme.splitlines()
                   if line.startswith(f"| {path.name[:2]} | [{path.name}]"))
        github = f"{REPOSITORY}/blob/{opening.BRANCH}/notebooks/{path.name}"
        colab = github.replace("https://github.com/", "https://colab.research.google.com/github/")
        assert f"]({colab})" in row and f"({opening.COLAB_BADGE})" in row, row
        assert f"](https://kaggle.com/kernels/welcome?src={github})" in row, row
        assert f"({opening.KAGGLE_BADGE})" in row, row
    start = readme.split("## The syllabus")[0]
    assert "(docs/hosted.md)" in start and f"fastdiff_helpers @ git+{REPOSITORY}" in start


def test_the_pages_t4_table_is_the_plans():
    from fastdiff_helpers.course.planning.gpus import PROFILES
    from fastdiff_helpers.course.planning.plan import plan

    page = (ROOT / "docs" / "hosted.md").read_text(encoding="utf-8")
    section = page.split("## Which notebooks run on a free T4", 1)[1].split("\n## ", 1)[0]
    words = {"runs": "runs as written", "swapped": "run swapped",
             "partly skipped": "partly skipped", "skipped": "skipped"}
    said = {number.strip(): verdict for numbers, verdict in re.findall(
        r"^\| ([\d, ]+) \| (runs as written|run swapped|partly skipped|skipped)", section, re.M)
        for number in numbers.split(",")}
    assert said == {row["notebook"][:2]: words[row["verdict"]] for row in plan(PROFILES["t4"])}


# --- hosted.py runs before the package can import ---------------------------------------------

def test_hosted_needs_only_the_standard_library():
    tree = ast.parse((ROOT / "fastdiff_helpers" / "course" / "hosted.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    done = subprocess.run([sys.executable, "-c", (
        "import runpy, sys\n"
        f"ns = runpy.run_path({str(ROOT / 'fastdiff_helpers' / 'course' / 'hosted.py')!r})\n"
        "assert callable(ns['prepare']) and callable(ns['finish'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'fastdiff_helpers', 'diffusers', 'numpy')))")],
        capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def _smi(*lines: str, code: int = 0):
    def run(cmd, **kwargs):
        assert cmd[0] == "nvidia-smi"
        return subprocess.CompletedProcess(cmd, code, "\n".join(lines) + "\n", "")
    return run


def _no_smi(cmd, **kwargs):
    raise FileNotFoundError("nvidia-smi")


def _online(address, timeout):
    return types.SimpleNamespace(close=lambda: None)


def _offline(address, timeout):
    raise OSError("Temporary failure in name resolution")


REQS = ["torch>=2.11", "diffusers<0.44,>=0.42"]
COLAB = {"COLAB_RELEASE_TAG": "release-colab-external-images_20260819", "COLAB_GPU": "1"}
KAGGLE = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}


def _check(environ, run=_no_smi, connect=_online, torch="2.11.0+cu128"):
    return hosted.check_host(environ, run, connect, {"torch": torch}.get, REQS)


def test_the_hosts_are_told_apart():
    assert hosted.host(COLAB) == "colab" and hosted.host(KAGGLE) == "kaggle"
    assert hosted.host({"HOME": "/root"}) == "jupyter"


def test_no_gpu_names_the_menu_entry_that_gives_one_and_goes_on():
    assert _check(COLAB) == ["no GPU on this Colab runtime: the notebooks run their CPU story "
                             "(tiny models). For a GPU: Runtime > Change runtime type > T4 GPU, "
                             "then run this cell again."]
    assert "Session options > Accelerator > GPU T4 x2" in _check(KAGGLE)[0]
    assert "no GPU on this Jupyter runtime" in _check({})[0]
    assert "no GPU" in _check(COLAB, run=_smi("", code=9))[0]  # a driver that answers nothing
    assert _check(COLAB, run=_smi("Tesla T4, 7.5")) == []


def test_a_p100_or_older_is_refused_with_the_reason():
    with pytest.raises(hosted.HostError) as info:
        _check(KAGGLE, run=_smi("Tesla P100-PCIE-16GB, 6.0"))
    message = str(info.value)
    assert message.startswith("fastdiff: the Tesla P100-PCIE-16GB (compute capability 6.0)")
    assert "no tensor cores" in message and "GPU T4 x2" in message
    assert _check(KAGGLE, run=_smi("Tesla T4, 7.5", "Tesla T4, 7.5")) == []  # Kaggle's two T4s


def test_torch_below_the_floor_says_what_to_do_and_never_reinstalls_it():
    with pytest.raises(hosted.HostError) as info:
        _check(KAGGLE, torch="2.10.0+cu128")
    message = str(info.value)
    assert "torch 2.10.0+cu128 here is older than the course's floor, torch>=2.11" in message
    assert "Open the notebook on Colab" in message and "never replaces torch" in message
    with pytest.raises(hosted.HostError, match="this Python has no torch"):
        _check({}, torch=None)
    assert _check(COLAB, run=_smi("NVIDIA L4, 8.9"), torch="2.11.0+cu128") == []
    assert hosted.torch_floor(hosted.requirements()) == "2.11"  # pyproject's, as installed


def test_no_internet_is_said_before_the_install():
    with pytest.raises(hosted.HostError) as info:
        _check(KAGGLE, run=_smi("Tesla T4, 7.5"), connect=_offline)
    assert str(info.value) == (
        "fastdiff: no internet: the helpers' requirements come from the package index. Turn it "
        "on in the editor's Session options > Internet (Kaggle asks for a phone-verified account "
        "first).")
    offline_index = dict(KAGGLE, PIP_NO_INDEX="1")  # a wheelhouse: no index asked
    assert _check(offline_index, run=_smi("Tesla T4, 7.5"), connect=_offline) == []


def test_a_card_torch_has_no_kernels_for_is_refused_by_course_settings(monkeypatch):
    """Installed in a clone, the same rule holds at the parameters cell, with torch's own arch
    list: a V100 (sm_70) under a CUDA 12.8 build (Turing and newer) is refused before loading."""
    cu128 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert hosted.card_problem("Tesla T4", (7, 5), cu128) is None
    assert "no kernels for the Tesla V100" in hosted.card_problem("Tesla V100", (7, 0), cu128)
    assert hosted.card_problem("NVIDIA B300", (10, 3), cu128 + ["compute_100"]) is None  # PTX
    monkeypatch.delenv("FASTDIFF_SMOKE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "Tesla P100-PCIE-16GB")
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda *a: (6, 0))
    monkeypatch.setattr("torch.cuda.get_arch_list", lambda: cu128)
    with pytest.raises(FastdiffError, match="Tesla P100-PCIE-16GB .*older than the course's"):
        fdh.course.settings("sdxl", weights="tiny")


def test_the_constraints_hold_torch_numpy_and_jupyter_and_nothing_else():
    def dist(name, version):
        return types.SimpleNamespace(metadata={"Name": name}, version=version)
    dists = [dist("torch", "2.11.0+cu128"), dist("torchvision", "0.26.0"), dist("numpy", "2.1.3"),
             dist("ipython", "7.34.0"), dist("ipykernel", "6.17.1"), dist("ipywidgets", "7.7.1"),
             dist("jupyter_client", "8.6.3"), dist("prompt_toolkit", "3.0.51"),
             dist("nvidia-cudnn-cu12", "9.19.0"), dist("diffusers", "0.39.0"),
             dist("transformers", "5.15.0"), dist("pillow", "11.3.0")]
    assert hosted.held_lines(dists) == [
        "ipykernel==6.17.1", "ipython==7.34.0", "ipywidgets==7.7.1", "jupyter-client==8.6.3",
        "numpy==2.1.3", "nvidia-cudnn-cu12==9.19.0", "prompt-toolkit==3.0.51",
        "torch==2.11.0+cu128", "torchvision==0.26.0"]


def test_prepare_writes_its_constraints_under_the_users_cache_and_quotes_for_the_shell(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network asked in this test
    args = hosted.prepare()
    constraints = tmp_path / "cache" / "fastdiff" / "host-constraints.txt"
    held = constraints.read_text().split()
    assert f"torch=={hosted.installed('torch')}" in held and any(h.startswith("numpy==") for h in held)
    assert args.startswith(f"-c {constraints} ") and "'diffusers<0.44,>=0.42'" in args
    assert "fastdiff_helpers' 13 requirements" in capsys.readouterr().out
    assert not (ROOT / "fastdiff_helpers" / "host-constraints.txt").exists()


def test_a_restart_is_asked_only_when_an_imported_module_changed(monkeypatch, capsys):
    versions = {"numpy": "2.1.3", "typing-extensions": "4.12.2"}
    assert hosted.restart_needed(versions, {"numpy": "2.1.3", "typing-extensions": "4.12.2"}.get) == []
    assert hosted.restart_needed(versions, {"numpy": "2.1.3", "typing-extensions": "4.15.0"}.get
                                 ) == ["typing-extensions 4.12.2 -> 4.15.0"]
    monkeypatch.setenv("COLAB_RELEASE_TAG", "x")
    with pytest.raises(hosted.HostError) as info:
        hosted.finish({"numpy": "0.0.1"})
    assert "restart the kernel now (Runtime > Restart session)" in str(info.value)
    assert "numpy 0.0.1 -> " in str(info.value)
    now = hosted.imported_versions()
    assert "torch" in now and "numpy" in now  # this process imported both
    assert "no restart needed" in hosted.finish(now)


# --- the token of a gated model comes from the host's secrets ----------------------------------

def test_kaggles_secret_is_read_and_colab_is_left_to_huggingface_hub(monkeypatch):
    class Secrets:
        def get_secret(self, name):
            assert name == "HF_TOKEN"
            return "hf_from_kaggle"
    monkeypatch.setitem(sys.modules, "kaggle_secrets",
                        types.SimpleNamespace(UserSecretsClient=Secrets))
    environ = dict(KAGGLE)
    assert hub.host_token(environ) == "Kaggle's secret HF_TOKEN"
    assert environ["HF_TOKEN"] == "hf_from_kaggle"
    assert hub.host_token({**KAGGLE, "HF_TOKEN": "mine"}) is None  # the user's own token wins
    assert hub.host_token(dict(COLAB)) is None  # huggingface_hub reads Colab's secret itself

    class NoSecret:
        def get_secret(self, name):
            raise ValueError("no secret HF_TOKEN attached")
    monkeypatch.setitem(sys.modules, "kaggle_secrets",
                        types.SimpleNamespace(UserSecretsClient=NoSecret))
    assert hub.host_token(dict(KAGGLE)) is None


def test_a_gated_model_names_the_hosts_secret_and_no_notebook_asks_for_a_token():
    assert "Colab secret named HF_TOKEN" in hub.gate_todo("black-forest-labs/FLUX.1-dev",
                                                          environ=COLAB)
    assert "Kaggle secret named HF_TOKEN" in hub.gate_todo("x/y", environ=KAGGLE)
    assert "`hf auth login`" in hub.gate_todo("x/y", environ={})
    asking = [p.name for p in NOTEBOOKS if re.search(
        r"notebook_login|getpass|interpreter_login|\blogin\(", "\n".join(_code(_nb(p))))]
    assert not asking, asking


# --- Python 3.13 ------------------------------------------------------------------------------

# What Python 3.13 no longer has: PEP 594's dead batteries (removed in 3.13) and lib2to3, and
# what 3.12 removed before it (distutils, imp, asynchat, asyncore, smtpd).
REMOVED_BY_313 = {"aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap",
                  "msilib", "nis", "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau",
                  "telnetlib", "uu", "xdrlib", "lib2to3", "distutils", "imp", "asynchat",
                  "asyncore", "smtpd"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    return found | {n.module.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}


def test_no_module_imports_what_python_313_removed():
    files = [*(ROOT / "fastdiff_helpers").rglob("*.py"), *(ROOT / "tools").glob("*.py"),
             *(ROOT / "tests").rglob("*.py")]
    found = {f"{p.relative_to(ROOT)}: {m}" for p in files for m in _imports(p) & REMOVED_BY_313}
    assert not found, sorted(found)
    probe = ROOT / "tools" / "test_suite.py"  # the check sees an import where there is one
    assert "subprocess" in _imports(probe)


def test_the_package_declares_python_310_to_313():
    from packaging.specifiers import SpecifierSet

    declared = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert all(f"3.{minor}.0" in declared for minor in (10, 11, 12, 13))
    assert "3.14.0" not in declared and "3.9.0" not in declared


@pytest.mark.slow
def test_every_requirement_has_a_python_313_wheel_or_is_pure_python(tmp_path):
    """Resolved as the wheelhouse checks a target (tools/wheelhouse.py build: the floor, then
    `pip download --only-binary=:all: --python-version 3.13` of each pinned requirement and of
    what it needs); torch is the host's (never carried)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "tools" / "wheelhouse.py")
    wh = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("wheelhouse", wh)
    spec.loader.exec_module(wh)
    platform = "manylinux_2_28_x86_64"
    manifest = wh.build({"torch": "2.13.0"}, tmp_path / "wh", "3.13", platform)
    files = {w["name"]: w["file"] for w in manifest["wheels"]}
    pins = {name: version for name, version in wh.pins(ROOT).items() if name != "torch"}
    # the rest of requirements.txt (JupyterLab, playwright, pytest-xdist): make's set
    rest = [f"{name}=={version}" for name, version in pins.items() if name not in files]
    have = {"torch": "2.13.0", **{w["name"]: w["version"] for w in manifest["wheels"]}}
    files |= {w.name: w.filename for w in wh.resolve(
        rest, have, wh.pip_index(tmp_path / "wh" / "wheels", "3.13", platform), "3.13",
        platform, pins)}
    assert set(pins) <= set(files), sorted(set(pins) - set(files))
    assert all(files[name].split("-")[1] == version for name, version in pins.items())
    for name, file in files.items():
        tags = file[:-len(".whl")].rsplit("-", 3)[-3:]
        assert tags[0] == "py3" or tags[1] in ("cp313", "abi3", "none") or tags[0].startswith(
            "cp313"), f"{file}: not a wheel Python 3.13 takes"


# --- the stand-in: a hosted notebook's environment --------------------------------------------

# Colab's GPU runtime (googlecolab/backend-info pip-freeze.gpu.txt at a7240792, 2026-08-19), on
# this machine's Python 3.11 and the pinned torch 2.13.0 CPU build in place of Colab's 2.11.0.
STANDIN = ["torch==2.13.0", "numpy==2.1.3", "ipython==7.34.0", "ipykernel==6.17.1",
           "ipywidgets==7.7.1", "notebook==6.5.7", "nbclient==0.10.4", "diffusers==0.39.0",
           "torchao==0.10.0", "transformers==5.15.0", "huggingface_hub==1.27.0",
           "accelerate==1.14.0", "peft==0.20.0", "tokenizers==0.22.2", "safetensors==0.8.0",
           "pillow==11.3.0", "matplotlib==3.10.0"]
STANDIN_DIR = ROOT / "out" / "hosted-standin"
HELD = ("torch", "numpy", "ipython", "ipykernel", "ipywidgets")
STANDIN_NOTEBOOKS = ("00_setup.ipynb", "03_attention.ipynb")  # the set-up check, a technique


def _pip(python: Path, *args: str, timeout: int = 1800) -> str:
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _freeze(python: Path) -> dict[str, str]:
    """{name: version} of what is installed ("name @ URL" lines: the URL as the version)."""
    found = {}
    for line in _pip(python, "freeze", "--all").splitlines():
        name, _, version = line.partition(" @ ") if " @ " in line else line.partition("==")
        if version:
            found[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return found


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    """The stand-in's Python, as built: made once (a minute or two) and kept between runs;
    every use puts it back as it was (the package and what its install added or changed)."""
    venv, marker = STANDIN_DIR / "venv", STANDIN_DIR / "packages.json"
    python = venv / "bin" / "python"
    if not python.exists() or not marker.exists() or json.loads(marker.read_text())[
            "asked"] != STANDIN:
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        _pip(python, "install", "--quiet", "--no-compile", *STANDIN)
        marker.write_text(json.dumps({"asked": STANDIN, "freeze": _freeze(python)}))
    built = json.loads(marker.read_text())["freeze"]
    now = _freeze(python)
    extra = sorted(set(now) - set(built))
    if extra:
        _pip(python, "uninstall", "--yes", "--quiet", *extra)
    changed = [f"{name}=={version}" for name, version in built.items() if now.get(name) != version]
    if changed:
        _pip(python, "install", "--quiet", "--no-compile", "--no-deps", *changed)
    assert _freeze(python) == built
    return python


def _source_copy(folder: Path) -> Path:
    """What `pip install <repository>` builds from, without the clone around it."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, folder / name)
    shutil.copytree(ROOT / "results", folder / "results")
    shutil.copytree(ROOT / "fastdiff_helpers", folder / "fastdiff_helpers", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


RUN = """\
import json, sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], 4)
try:  # as Run All in Jupyter: the first error stops the run
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3").execute()
except nbclient.exceptions.CellExecutionError:
    pass
print(json.dumps([{"text": "".join(o.get("text", "") for o in c.get("outputs", [])
                                   if o.get("output_type") == "stream"),
                   "errors": [o["ename"] + ": " + o["evalue"] for o in c.get("outputs", [])
                              if o.get("output_type") == "error"]}
                  for c in nb.cells if c.cell_type == "code"]))
"""


def _run_notebook(python: Path, path: Path, env: dict) -> list[dict]:
    """Each code cell's printed text and errors, the notebook run by the stand-in's nbclient
    and kernel (jupyter_client starts the kernel with the Python that asks)."""
    done = subprocess.run([str(python), "-c", RUN, str(path)], capture_output=True, text=True,
                          env=env, cwd=path.parent, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_notebooks_alone_install_the_helper_on_a_hosted_stand_in(standin, tmp_path):
    site = Path(subprocess.run([str(standin), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    before = _freeze(standin)
    alone = tmp_path / "opened-from-a-link"
    alone.mkdir()
    for name in STANDIN_NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / name, alone / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(FASTDIFF_SMOKE="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg", TQDM_DISABLE="1",
               XDG_CACHE_HOME=str(tmp_path / "cache"), PATH=f"{standin.parent}:{env['PATH']}")

    # no internet (a source pip cannot reach): said in one line, nothing installed
    unreachable = _run_notebook(standin, alone / STANDIN_NOTEBOOKS[0],
                                dict(env, FASTDIFF_SOURCE="git+https://127.0.0.1:9/fastdiff.git"))
    assert unreachable[0]["errors"] == ["SystemExit: fastdiff: pip could not get "
                                        "git+https://127.0.0.1:9/fastdiff.git (see above). No "
                                        "internet? Kaggle: Session options > Internet on."]
    assert not unreachable[1]["text"] and not unreachable[1]["errors"]  # the run stopped there
    assert _freeze(standin) == before

    env["FASTDIFF_SOURCE"] = str(_source_copy(tmp_path / "source"))
    outputs = {name: _run_notebook(standin, alone / name, env) for name in STANDIN_NOTEBOOKS}
    for name, cells in outputs.items():
        errors = [error for cell in cells for error in cell["errors"]]
        assert not errors, (name, errors)
    first = outputs[STANDIN_NOTEBOOKS[0]][0]["text"]
    assert "fastdiff: installing fastdiff_helpers' 13 requirements" in first, first
    assert "no restart needed" in first and "no GPU on this Jupyter runtime" in first, first
    assert outputs[STANDIN_NOTEBOOKS[1]][0]["text"] == ""  # installed now: it only imports
    assert (tmp_path / "cache" / "fastdiff" / "host-constraints.txt").exists()

    after = _freeze(standin)
    assert {n: after[n] for n in HELD} == {n: before[n] for n in HELD}
    assert after["diffusers"] != before["diffusers"] and "fastdiff-helpers" in after
    probe = subprocess.run([str(standin), "-c", (
        "import fastdiff_helpers as fdh, ipywidgets\n"
        "print(fdh.__file__)\n"
        "print(fdh.course.settings('sdxl'))\n"
        "print(sorted(fdh.course.reference_results('sdxl')))\n"
        "panel = fdh.playground()\n"  # ipywidgets 7.7.1, Colab's
        "panel.run()\n"
        "print(ipywidgets.__version__, len(panel.rows), repr(panel.error.value))\n")],
        capture_output=True, text=True, env=env, cwd=alone, timeout=900)
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = probe.stdout.strip().splitlines()
    assert lines[0] == str(site / "fastdiff_helpers" / "__init__.py")  # the install, not the clone
    # the parameters cell's line (issue 59): the versions the code was written for, and the
    # host's that differ
    assert lines[1].startswith("fastdiff: the code on these pages was written for torch 2.13.0")
    assert "CourseSettings(model='sdxl', weights='tiny'" in lines[2]
    assert "h100-80gb-hbm3" in lines[3]  # the committed results, shipped as package data
    assert lines[-1] == "7.7.1 1 ''", lines[-1]
    record = next(site.glob("fastdiff_helpers-*.dist-info")) / "RECORD"
    installed = {line.split(",")[0] for line in record.read_text().splitlines()}
    written = [str(p.relative_to(site)) for p in (site / "fastdiff_helpers").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts
               and str(p.relative_to(site)) not in installed]
    assert not written, written  # nothing written into the package's folder after its install
