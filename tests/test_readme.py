"""The README's commands and code, and the commands in the notebooks' prose, run as written
(issue 24). The README is a landing page; the rest of its text lives on the pages under docs/
that it links (issue 46), and each of them is read here as the README is (doc_pages.DOCS).

Each is taken from the file itself (fenced ```bash and ```python blocks of the README and its
pages; inline or
fenced commands of the notebooks' markdown that start with `.venv/bin/`, `make ` or an
environment assignment before them) and run in smoke mode (FASTDIFF_SMOKE=1: tiny weights on
the CPU, 2 steps; docs/running.md says so), from a scratch folder that holds a link to this
checkout's .venv and, as the user's own input the notebooks name, a prompts.txt. A `make`
target is dry-run (`make -n`): its recipe would set up .venv, and its command is one of the
lines run here. A line whose comment starts with "GPU:" is skipped without a CUDA GPU, saying
so. The fast tests check the extraction; running everything compiles several ladders (minutes
on a CPU), so that test is slow.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from doc_pages import DOCS, PAGES, README, ROOT, doc_texts

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:\.venv/bin/|make |mkdir |source )")
# what the notebooks call the user's own prompts file (18_scale_out.ipynb)
PROMPTS = [f"a watercolour of lighthouse number {i}" for i in range(1, 9)]


def fenced(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order ("" for a block without one)."""
    blocks, language, lines = [], None, []
    for line in markdown.splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(lines)))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced bash or python block of the README and its pages, in
    order."""
    return [(lang, code) for _, text in doc_texts() for lang, code in fenced(text)
            if lang in ("bash", "python")]


def _lines(code: str) -> list[str]:
    """Shell lines, a trailing backslash joining the next."""
    return [line.strip() for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def _commands(markdown: str, languages: tuple[str, ...] = ("bash", "")) -> list[str]:
    """The commands of a piece of markdown: every line of its fenced shell blocks, and every
    inline code span that starts like a command (.venv/bin/..., make, mkdir, source)."""
    shell = [" ".join(line.split()) for lang, code in fenced(markdown) if lang in languages
             for line in _lines(code)]
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    inline = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return shell + [c for c in inline if COMMAND.match(c)]


def _once(commands: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each command once (its comment aside), where it first appears."""
    seen, kept = set(), []
    for where, command in commands:
        key = command.split(" # ")[0].strip()
        if key not in seen:
            seen.add(key)
            kept.append((where, command))
    return kept


def notebook_commands() -> list[tuple[str, str]]:
    """(notebook, command) for every command in the notebooks' markdown, in order, once each."""
    return _once([(path.name, command) for path in NOTEBOOKS
                  for cell in nbformat.read(path, as_version=4).cells
                  if cell.cell_type == "markdown" for command in _commands(cell.source)])


def readme_commands() -> list[tuple[str, str]]:
    """(file, command) for the bash blocks' lines and inline commands of the README and its
    pages, once each, in the order a reader meets them."""
    return _once([(where, c) for where, text in doc_texts() for c in _commands(text, ("bash",))])


def _gpu_only(command: str) -> str | None:
    comment = command.partition(" # ")[2].strip()
    return comment if comment.startswith("GPU:") else None


# -- fast: what is extracted is what a newcomer reads ------------------------------------------

def test_the_readme_writes_commands_a_fresh_clone_can_run():
    commands = [c for _, c in readme_commands()]
    own = [c for where, c in readme_commands() if where == "README.md"]
    assert [c for c in own if c.startswith("make demo")] and \
        [c for c in own if c.startswith("make test")]  # the landing page's two commands
    python = [re.sub(r"^(?:[A-Z_]+=\S+ )+", "", c) for c in commands if "fastdiff_helpers" in c]
    assert python and all(c.startswith((".venv/bin/python -m", ".venv/bin/torchrun")) for c in python)
    assert not [c for c in commands if c.startswith(("python ", "jupyter ", "torchrun "))]
    assert "source .venv/bin/activate" in README.read_text()  # or activate: said once
    assert [c for c in commands if _gpu_only(c)], "the GPU-only line is marked"
    (code,) = [code for language, code in readme_blocks() if language == "python"]
    compile(code, "docs/helpers.md", "exec")  # it parses; the slow test runs it


def _anchor(heading: str) -> str:
    """A markdown heading's anchor as GitHub writes it: lower case, punctuation dropped, each
    space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(markdown: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return re.findall(r"\]\(\s*<?([^)\s>]+)", prose)


def test_the_readme_is_a_landing_page_that_links_each_page():
    """Issue 46: what this is, the two commands, then the syllabus, and a link to each page under
    docs/; every page there is one the tests read (doc_pages.PAGES)."""
    text = README.read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[:2] == ["Start here", "The syllabus"], sections
    assert "Where to go next" in sections
    assert sorted((ROOT / "docs").glob("*.md")) == sorted(PAGES), "list a new page in doc_pages.py"
    linked = {(README.parent / link.split("#")[0]).resolve() for link in _links(text)}
    assert not [p.name for p in PAGES if p.resolve() not in linked]


def test_every_link_of_the_documentation_leads_somewhere():
    """A relative link of the README or a page names a file of the checkout, and its #anchor a
    heading of that file: moving text between pages leaves no link behind."""
    broken = []
    for path in DOCS:
        for link in _links(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", link):
                continue
            target, _, anchor = link.partition("#")
            file = (path.parent / target).resolve() if target else path
            if not file.exists():
                broken.append(f"{path.name}: {link}")
            elif anchor and anchor not in {_anchor(h) for h in re.findall(
                    r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}:
                broken.append(f"{path.name}: {link} (no such heading)")
    assert not broken, broken


def test_what_points_at_the_documentation_finds_it():
    """A page under docs/ or a README section that the package, the Makefile, the tools or the
    notebooks name exists: issue 46 moved the README's sections to docs/, and two docstrings
    had named a README section, "The course on a GPU", that never was one."""
    texts = [(path.name, path.read_text(encoding="utf-8")) for path in
             [*sorted((ROOT / "fastdiff_helpers").rglob("*.py")), ROOT / "Makefile",
              *sorted(p for p in (ROOT / "tools").glob("*") if p.is_file())]]
    texts += [(path.name, "\n".join(c.source for c in nbformat.read(path, as_version=4).cells))
              for path in NOTEBOOKS]
    headings = set(re.findall(r"^#+ (.+)$", README.read_text(encoding="utf-8"), re.M))
    wrong, named = [], 0
    for where, text in texts:
        flat = " ".join(text.split())
        for page in re.findall(r"\bdocs/[\w-]+\.md", flat):
            named += 1
            if not (ROOT / page).is_file():
                wrong.append(f"{where}: {page}")
        wrong += [f"{where}: README section {section!r}" for section in
                  re.findall(r"\bREADME(?:'s |: | \()\"([^\"]+)\"", flat) if section not in headings]
    assert named >= 10, named  # the pointers this test reads are found
    assert not wrong, wrong


def test_the_notebooks_prose_writes_commands_a_fresh_clone_can_run():
    """No bare `python -m`, `jupyter` or `torchrun` (not on the PATH of a fresh clone), and no
    placeholder (`...`) in a command."""
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                bare = re.findall(r"(?<![/\w])(?:python -m fastdiff_helpers|jupyter lab|"
                                  r"torchrun --)", cell.source)
                assert not bare, (path.name, cell.get("id"), bare)
    commands = notebook_commands()
    # 05_cold_start's workshop steps moved to the instructor's page (issue 50), where they are
    # run as the README's pages are (its lines are helpers.md's, so they run once)
    instructor = (ROOT / "docs" / "instructor.md").read_text(encoding="utf-8")
    assert any("warm --load" in c for c in _commands(instructor, ("bash",)))
    assert not [c for _, c in commands if "..." in c]


# -- slow: run them ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("newcomer")
    (folder / ".venv").symlink_to(ROOT / ".venv")
    (folder / "prompts.txt").write_text("".join(p + "\n" for p in PROMPTS))
    for name in ("Makefile", "requirements.txt", "pyproject.toml", "README.md"):  # make -n, pytest
        shutil.copy(ROOT / name, folder / name)
    for name in ("notebooks", "tests", "docs"):  # what a command names (nbconvert, pytest)
        shutil.copytree(ROOT / name, folder / name)
    return folder


def _env(scratch: Path) -> dict[str, str]:
    # make test's compile cache, shared by the whole suite (tools/test_suite.py): these commands
    # are not about cold compiles (test_cold_start.py is). inductor's own variable names it too:
    # the README's Python block applies its recipe without the course's tuning= hook, so it
    # compiles into torch's folder (since issue 58 the core leaves the folder to torch), which
    # without the variable is torch's default under /tmp, kept from one make test to the next
    # and never shared with the ladder lines that compiled the same graphs (measured: the block
    # took 68 s after them, 14 s with the one folder: this test's time, each on a fresh folder)
    cache = os.environ.get("FASTDIFF_CACHE_DIR", str(scratch / "compile-cache"))
    return dict(os.environ, FASTDIFF_SMOKE="1", HF_HUB_OFFLINE="1", TQDM_DISABLE="1",
                FASTDIFF_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=cache,
                # this checkout's package (a fresh clone's .venv has it installed)
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                           if p))


# The scratch clone's `.venv` is a link to this checkout's, and a Python started through a link
# to its venv takes the link's path for sys.prefix: torch's include folders, which inductor
# passes to g++, would then name the scratch folder, and every C++ kernel is keyed by its
# compile command (torch/_inductor/codecache.py:3763, CppCodeCache.load_async hashes the code
# with the command line of its build options), so the README's lines rebuilt with g++ every
# kernel the rest of make test had built, and theirs were of no use to it (measured: a tiny
# VAE decode whose FX graph was a cache hit took 16.2 s through the link, 3.4 s without, with
# 31 more .so files). A clone's own `.venv` is no link: run its interpreter by its real path,
# in the scratch folder.
PYTHON = re.compile(r"(?<![\w/.])\.venv/bin/python(?=\s)")
VENV_PYTHON = str(ROOT / ".venv" / "bin" / "python")


def _interpreter(command: str) -> str:
    return PYTHON.sub(VENV_PYTHON, command)


def _run(command: str, scratch: Path) -> subprocess.CompletedProcess:
    assert (scratch / ".venv" / "bin" / "python").exists()
    command = _interpreter(command)
    if command.startswith("make ") or " make " in command:
        pre, _, target = command.partition("make ")
        command = f"{pre}make -n {target}"  # the recipe's command runs as its own line
    return subprocess.run(["bash", "-c", command], cwd=scratch, env=_env(scratch),
                          capture_output=True, text=True, timeout=1800)


ALL = _once(readme_commands() + notebook_commands())
CLI = [".venv/bin/python", "-m", "fastdiff_helpers"]


def cli_run(command: str, monkeypatch) -> tuple[dict, str | None] | None:
    """What a `.venv/bin/python -m fastdiff_helpers ...` line runs, as the CLI's own parser
    reads it in smoke mode, weights="auto" resolved as the CLI resolves it here: (every
    argument but --out, --out), or None for any other line."""
    from fastdiff_helpers.models.pretrained import resolve_weights
    from fastdiff_helpers.course.runs.cli import build_parser

    words = shlex.split(command.split(" # ")[0])
    while words and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
        words.pop(0)
    if words[:3] != CLI:
        return None
    monkeypatch.setenv("FASTDIFF_SMOKE", "1")  # the defaults the line gets in _env
    args = vars(build_parser().parse_args(words[3:]))
    monkeypatch.undo()
    if args.get("weights") == "auto":
        args["weights"] = resolve_weights(args["model"], "auto", args.get("device") or "cpu",
                                          verbose=False)
    return args, args.pop("out", None)


RAN: dict[str, tuple[str, str | None]] = {}  # a run's arguments -> (the line, its --out)
LADDERS_RAN: set[tuple[str, str]] = set()  # (ladder, model) of the ladder lines run so far


def check_blog_ladder(scratch: Path, out: str, model: str) -> None:
    """The blog's whole ladder on a tiny model, every compiled step through inductor on the CPU
    (the one policy: max-autotune without its CUDA graphs, said): the end-to-end run of the
    ladder flow that test_bench.py's own full ladder used to repeat: the README's SDXL line and
    its smoke-mode SD1.5 example (which 17_all_models.ipynb's command repeats, taking its
    output)."""
    from fastdiff_helpers.course.planning.ladders import LADDER
    from test_bench import check_ladder_folder

    stored = check_ladder_folder(scratch / out, [name for name, _ in LADDER], model)
    assert all(r.ok for r in stored), [r.error for r in stored]
    compiled = [r for r in stored if r.recipe["compile"]]
    ran = "max-autotune-no-cudagraphs"
    assert compiled and all(r.recipe["compile"] == ran for r in compiled)
    assert all(any(f"ran compile='{ran}'" in n for n in r.notes) for r in compiled)


def check_course_ladder(scratch: Path, out: str) -> None:
    """The course's ladder run by a README line (smoke mode: the tiny model on the CPU): every
    step in order, each one run, but fp8 and the autotuning step on top of it, which a CPU
    refuses with the reason. The ladder keeps going past a failed step (run_ladder isolates
    failures), so the command's exit status alone would not show one."""
    from fastdiff_helpers.results.store import load_results
    from fastdiff_helpers.course.planning.ladders import COURSE_LADDER

    stored = load_results(scratch / out / "results.jsonl")
    assert [r.step for r in stored] == [name for name, _ in COURSE_LADDER]
    failed = {r.step: r.error for r in stored if not r.ok}
    assert list(failed) == ["+ fp8 dynamic", "+ autotune"], failed
    assert all("needs a GPU with fp8 tensor cores" in error for error in failed.values())


@pytest.mark.slow
@pytest.mark.parametrize("where, command", ALL, ids=[f"{w}: {c[:60]}" for w, c in ALL])
def test_every_command_runs_as_written(where, command, scratch, monkeypatch):
    """Each line runs, once: a line whose run (its arguments, as the CLI reads them) is one
    that an earlier line made, the same flow into another folder, takes that run's output
    instead of computing it again."""
    import torch

    from fastdiff_helpers.course.runs.ladder import resolve_ladder
    from fastdiff_helpers.models.noise import KNOWN_LOG_NOISE

    if _gpu_only(command) and not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA GPU ({_gpu_only(command)})")
    run = cli_run(command, monkeypatch)
    key = repr(sorted(run[0].items())) if run else None
    if key in RAN:
        line, out = RAN[key]
        if out and out != run[1]:  # the earlier run's output, where this line expects it
            source, target = scratch / out, scratch / run[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        assert (scratch / (run[1] or out or ".")).exists(), (line, command)
        return
    done = _run(command, scratch)
    assert done.returncode == 0, (where, command, done.stdout[-2000:], done.stderr[-3000:])
    # the libraries' known harmless messages stay silenced (models/noise.py): `clock`, `plan`
    # and `download` printed torchao's, torch's and transformers' lines before
    shown = [p for _, p, _ in KNOWN_LOG_NOISE if re.search(p, done.stderr)]
    assert not shown, (command, shown, done.stderr[-2000:])
    if key:
        RAN[key] = (command, run[1])
    if command.startswith("make demo"):
        assert "-m fastdiff_helpers demo" in done.stdout
        assert [c for _, c in readme_commands() if "fastdiff_helpers demo" in c]
    if run and run[0]["command"] == "ladder":
        ladder = resolve_ladder(run[0]["model"], run[0]["ladder"])
        LADDERS_RAN.add((ladder, run[0]["model"]))
        if ladder == "blog":
            check_blog_ladder(scratch, run[1], run[0]["model"])
        elif ladder == "course":
            check_course_ladder(scratch, run[1])


@pytest.mark.slow
def test_the_python_block_runs_as_written(scratch):
    (code,) = [code for language, code in readme_blocks() if language == "python"]
    (scratch / "readme_block.py").write_text(code)
    done = subprocess.run([VENV_PYTHON, "readme_block.py"], cwd=scratch,
                          env=_env(scratch), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "psnr" in done.stdout and (scratch / "out" / "run.png").is_file()
    # the recipe written out is the blog's last step, loaded as the blog's ladder loads it, so
    # after the README's ladder line it compiles nothing new (make test's shared cache): every
    # graph of its first call is a cache hit (when the ladder line ran first, as in make test)
    assert "the blog's last step: True" in done.stdout
    from fastdiff_helpers.results.store import load_results

    cold = load_results(scratch / "out" / "run.jsonl")[1].compile_events["cold"]
    if ("blog", "sdxl") in LADDERS_RAN:
        assert cold["graph_cache_hits"] > 0 and cold["graph_cache_misses"] == 0, cold
    import torch

    if not torch.cuda.is_available():
        assert "ran compile='max-autotune-no-cudagraphs'" in done.stdout  # the policy, said


def test_make_lab_asks_no_news_question_and_keeps_the_participants_outputs(tmp_path):
    """Issue 24: JupyterLab asked "Would you like to get notified about official Jupyter news?"
    in a pop-up over every page (its announcements plugin asks while the setting fetchNews is
    "none"); `make lab` gives JupyterLab tools/jupyterlab/overrides.json, which answers "false".
    Issue 46: a pre-save hook then saved the course's notebooks without outputs, so a browser
    reload lost a participant's results. Now the file keeps them, git stores the notebook clean
    (the filter of `make nbfilter`, tests/test_nbclean.py) and the post-save hook
    (tools.nbclean.post_save, found through PYTHONPATH) keeps `git status` clean. The server is started
    with the recipe's own flags (not through make, which would first check .venv) on a clone-like
    copy, and asked through its REST API as JupyterLab does."""
    import json
    import signal
    import socket
    import time
    import urllib.request

    from test_nbclean import course_clone, git

    recipe = re.search(r"^lab: venv nbfilter\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(),
                       re.M)[1]
    flags = ["--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.app_settings_dir=$(CURDIR)/tools/jupyterlab",
             "--ContentsManager.post_save_hook=tools.nbclean.post_save"]
    assert all(flag in recipe for flag in flags) and "pre_save_hook" not in recipe, recipe
    assert "PYTHONPATH=$(CURDIR)" in recipe, recipe  # where the server finds tools.nbclean
    served = course_clone(tmp_path) / "notebooks"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONPATH=str(ROOT))
    server = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "jupyter"), "lab", "--no-browser", "--allow-root",
         "--ip", "127.0.0.1", "--port", str(port), "--IdentityProvider.token=t",
         *[f.replace("$(CURDIR)", str(ROOT)) for f in flags], str(served)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def call(path, data=None):
        request = urllib.request.Request(f"{base}{path}?token=t", method="PUT" if data else "GET",
                                         data=json.dumps(data).encode() if data else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                settings = call("/lab/api/settings/@jupyterlab/apputils-extension:notification")
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.5)
        ran = call("/api/contents/00_setup.ipynb")["content"]  # as JupyterLab loads it
        code = [c for c in ran["cells"] if c["cell_type"] == "code"]
        code[0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "hello\n"}]
        code[0]["execution_count"] = 1
        ran["metadata"]["widgets"] = {"state": {}}
        for name in ("00_setup.ipynb", "00_setup-Copy1.ipynb"):  # a run, saved; a copy
            call(f"/api/contents/{name}", {"type": "notebook", "format": "json", "content": ran})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    # overrides.json becomes the defaults the frontend composes its settings from
    defaults = {k: v.get("default") for k, v in settings["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False
    assert settings["raw"] in ("{}", {}, "")  # no user choice: the page asks nothing
    assert "hello" in (served / "00_setup.ipynb").read_text()  # the participant's file keeps it
    assert "hello" in (served / "00_setup-Copy1.ipynb").read_text()  # and so does a copy
    repo = served.parent
    assert git(repo, "status", "--porcelain").stdout == "?? notebooks/00_setup-Copy1.ipynb\n"
    committed = (ROOT / "notebooks" / "00_setup.ipynb").read_text(encoding="utf-8")
    assert git(repo, "show", ":notebooks/00_setup.ipynb").stdout == committed  # what git stores
