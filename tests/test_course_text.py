"""The course's text against its code and its sources (issue 23).

- (each technique's code runs in a cell of its notebook: tests/test_plain_cells.py);
- every helper a notebook calls names, in its docstring, the notebook that introduces it;
- the exercise code printed in a notebook runs (on the tiny model, in smoke mode);
- the claims the audit corrected stay corrected: the library behaviour they rest on is pinned
  here, and the wrong sentences do not come back;
- the course's order: cold start right after compile, syncs on a model where removing them
  changes something, the reference-numbers paragraph said once.
Fast: the notebooks are read, not executed (tests/test_notebooks.py executes them)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import torch

import fastdiff_helpers as fdh
from doc_pages import doc_texts

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FENCE = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.M | re.S)


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _by_name(prefix: str) -> Path:
    found = [p for p in NOTEBOOKS if p.name.startswith(prefix)]
    assert len(found) == 1, (prefix, [p.name for p in NOTEBOOKS])
    return found[0]


def _fences(text: str) -> list[str]:
    """The python code blocks of a markdown text, dedented (a block may sit in a list item)."""
    return [textwrap.dedent(textwrap.indent(body, indent)).rstrip("\n")
            for indent, body in FENCE.findall(text)]


# --- "Introduced in" ---------------------------------------------------------------------

def _sources(nb) -> list[str]:
    """The code a notebook shows: its code cells and the python blocks of its markdown."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            found.append("\n".join(line for line in cell.source.splitlines()
                                   if not line.lstrip().startswith(("%", "!"))))
        else:
            found += _fences(cell.source)
    return found


def _called_helpers(nb) -> set[str]:
    """Dotted names after `fdh.` that the notebook's code calls (code cells and python blocks
    in its text), and names imported from the package and called."""
    names: set[str] = set()
    for source in _sources(nb):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # a fragment in the text (test_notebooks checks the code cells)
        imported = {alias.asname or alias.name: f"{node.module}.{alias.name}"
                    for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("fastdiff_helpers")
                    for alias in node.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func, parts = node.func, []
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name) and func.id == "fdh":
                names.add(".".join(reversed(parts)))
            elif isinstance(func, ast.Name) and not parts and func.id in imported:
                names.add(imported[func.id])
    return names


def _resolve(name: str):
    if name.startswith("fastdiff_helpers."):
        module, _, attr = name.rpartition(".")
        return getattr(__import__(module, fromlist=[attr]), attr)
    obj = fdh
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def first_uses() -> dict[str, str]:
    first: dict[str, str] = {}
    for path in NOTEBOOKS:  # sorted by number: the course's order
        for name in sorted(_called_helpers(_read(path))):
            first.setdefault(name, path.name)
    return first


def test_every_helper_a_notebook_calls_names_its_first_notebook():
    """STYLE.md (d2l): a helper's docstring says which notebook introduces it."""
    problems, checked = [], 0
    for name, notebook in first_uses().items():
        obj = _resolve(name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not getattr(
                obj, "__module__", "").startswith("fastdiff_helpers"):
            continue  # dict methods and the like: not helpers
        checked += 1
        said = re.findall(r"Introduced in\s+(\d\d_\w+\.ipynb)", inspect.getdoc(obj) or "")
        if said[:1] != [notebook]:
            problems.append(f"{name}: first called in {notebook}, docstring says "
                            f"{said[0] if said else 'nothing'}")
    assert checked > 40
    assert not problems, "\n".join(problems)


def test_introduced_in_names_existing_notebooks():
    names = {p.name for p in NOTEBOOKS}
    stale = []
    for path in sorted((ROOT / "fastdiff_helpers").rglob("*.py")):
        for found in re.findall(r"\b(\d\d_\w+\.ipynb)", path.read_text()):
            if found not in names:
                stale.append(f"{path.relative_to(ROOT)}: {found}")
    assert not stale, stale


# --- exercise code printed in a notebook runs --------------------------------------------

def _exercise_blocks():
    for path in NOTEBOOKS:
        for cell in _read(path).cells:
            if cell.cell_type == "markdown":
                for block in _fences(cell.source):
                    if block.startswith("# exercise"):
                        yield path, block


def _parameters_cell(nb) -> str:
    """The parameters cell: the second code cell, after the first cell of every notebook."""
    return [c.source for c in nb.cells if c.cell_type == "code"][1]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path, block", list(_exercise_blocks()),
                         ids=[f"{p.name}:{b.splitlines()[0]}" for p, b in _exercise_blocks()])
def test_exercise_code_runs_on_the_tiny_model(path, block, monkeypatch):
    """An exercise's code, in the namespace of its notebook run in smoke mode: the parameters
    cell, then `baseline` (the fp32 Result) and `pipe` (the last pipeline) as the notebook
    leaves them."""
    monkeypatch.setenv("FASTDIFF_SMOKE", "1")
    nb = _read(path)
    namespace: dict = {"fdh": fdh}  # what the first cell imports
    exec(_parameters_cell(nb), namespace)
    settings = namespace["settings"]
    spec = fdh.MODELS[settings.model]  # the first step of the model's own ladder (Flux: bf16)
    recipe = fdh.Recipe() if "course" in spec.ladders else fdh.course.LADDERS[spec.ladders[0]][0][1]
    pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights,
                                       device=settings.device, verbose=False), recipe)
    namespace.update(pipe=pipe, baseline=fdh.benchmark(pipe, namespace.get("prompt", "a photo"),
                                                       progress=False, **settings.bench_kwargs()))
    namespace.setdefault("prompt", fdh.models.presets.DEFAULT_PROMPT)
    exec(compile(block, f"<{path.name} exercise>", "exec"), namespace)
    assert namespace["image"].size == (settings.width, settings.height)


def test_02_exercise_3_decodes_what_the_vae_cast_alone_cannot():
    """The reason the exercise decodes by hand (issue 23, item 1): SDXL's pipeline casts the
    latents to the VAE's dtype only for an fp16 VAE it upcasts itself, so a bf16 UNet with an
    fp32 VAE fails inside the decode."""
    pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="tiny", device="cpu", verbose=False),
                     fdh.Recipe(dtype="bf16"))
    pipe.vae.to(torch.float32)
    with pytest.raises(RuntimeError, match="BFloat16.*float"):
        fdh.generate(pipe, steps=2)
    assert any("# exercise 3" in block for path, block in _exercise_blocks()
               if path.name.startswith("02_"))


# --- the library behaviour behind corrected claims ---------------------------------------

def test_at_the_recompile_limit_fullgraph_raises_instead_of_running_eagerly():
    """Issue 23, item 2: every compiled rung uses fullgraph=True, and at the recompile limit
    dynamo raises FailOnRecompileLimitHit (torch/_dynamo/convert_frame.py, the recompile-limit
    branch); without fullgraph it runs the new input eagerly."""
    import torch._dynamo

    def double(x):
        return x * 2

    outcomes = {}
    for fullgraph in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(double, backend="eager", fullgraph=fullgraph, dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            compiled(torch.ones(2))
            try:
                out = compiled(torch.ones(3))
                outcomes[fullgraph] = out.tolist()
            except torch._dynamo.exc.FailOnRecompileLimitHit:
                outcomes[fullgraph] = "raised"
    torch._dynamo.reset()
    assert outcomes == {True: "raised", False: [2.0, 2.0, 2.0]}


def test_diffusers_fusion_keeps_the_unfused_projections_and_fdh_drops_them():
    """Issue 23, item 4: diffusers' fuse_qkv_projections keeps to_q/to_k/to_v (so
    diffusion-fast's fused UNet held the copies); fdh.fuse_qkv deletes them (the course's)."""
    pipe = fdh.load_pipeline("sdxl", weights="random", device="meta", verbose=False)
    fdh.set_attention(pipe, "sdpa")
    unet = pipe.unet
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684
    unet.fuse_qkv_projections()
    assert sum(p.numel() for p in unet.parameters()) == 3_215_450_884
    other = fdh.set_attention(fdh.load_pipeline("sdxl", weights="random", device="meta",
                                                verbose=False), "sdpa")
    fdh.fuse_qkv(other)
    assert sum(p.numel() for p in other.unet.parameters()) == 2_567_463_684


def test_the_blogs_two_compiled_sdxl_runs_differ_only_by_fusion():
    """Issue 23, item 5, as the course's own ladder encodes it: + fused QKV changes one field
    of + compile (diffusion-fast's experiment-scripts/run_sd.sh: the 2.54 s and 2.52 s runs
    differ only by --enable_fused_projections)."""
    (_, compiled), (_, fused) = fdh.course.LADDER[3], fdh.course.LADDER[4]
    assert fused.changes(compiled) == ["fuse_qkv"]


# --- the wrong sentences stay out ---------------------------------------------------------

GONE = [
    "gives up and runs it eagerly",                 # item 2
    "a weight of the same shape and flags does not",  # item 3
    "exactly what diffusion-fast ran",              # item 4
    "exactly as diffusion-fast ran",
    "does not credit fusion alone",                 # item 5
    "every step\nlooked up its index",              # item 6
    "above ~40 dB",                                 # item 7
    "shared facts",                                 # item 8
    "facts.md",
    "memory-bound matmuls",                         # item 10
    "Count its tokens per attention layer",         # item 11
    "put only the VAE back to fp32",                # item 1
    "130 s",                                        # a figure no stored source holds
    "2.966 s against 3.243",                        # issue 35: per row with fused QKV and a
    "fp8 per row + compile 2.966 s",                # compiled VAE against per tensor without
    "tests/gpu/test_gpu_memory.py",                 # issue 35: a test file that never existed
    "a `pipe(...)` call of your own passes it too", # issue 35: only the helpers' calls do
]


def _texts():
    for path in NOTEBOOKS:
        yield path.name, "\n".join(c.source for c in _read(path).cells)
    yield from doc_texts()
    for path in sorted((ROOT / "fastdiff_helpers").rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()


def test_the_corrected_phrases_do_not_come_back():
    found = [f"{where}: {phrase!r}" for where, text in _texts()
             for phrase in GONE if phrase in text]
    assert not found, found


# --- the order of the course -------------------------------------------------------------

def test_cold_start_comes_right_after_compile():
    """Caches and recompiles are taught before any notebook that compiles for minutes."""
    names = [p.name for p in NOTEBOOKS]
    assert names.index("05_cold_start.ipynb") == names.index("04_torch_compile.ipynb") + 1


def test_the_syncs_notebook_runs_a_model_where_removing_syncs_changes_something():
    nb = _read(_by_name("07_"))
    assert "syncs" in nb.cells[0].source
    model = re.search(r'course\.settings\("(\w+)"\)', _parameters_cell(nb)).group(1)
    pipe = fdh.load_pipeline(model, weights="tiny", device="cpu", verbose=False)
    fdh.remove_syncs(pipe)
    assert fdh.pipeline_info(pipe).applied["no_sync"]["changed"] is True


def test_the_reference_numbers_paragraph_is_said_once():
    said = [p.name for p in NOTEBOOKS
            if "Compare times only between runs on the same GPU" in
            "\n".join(c.source for c in _read(p).cells)]
    assert said == ["01_baseline.ipynb"]


def test_no_helper_claims_a_notebook_that_does_not_introduce_it():
    """The reverse: a public helper whose docstring says "Introduced in X" is first called in
    X; one that no notebook calls (a Result, which fdh.benchmark returns) may name a notebook
    only where that notebook's text names it."""
    first = {name.rpartition(".")[2]: nb for name, nb in first_uses().items()}
    text = {p.name: "\n".join(c.source for c in _read(p).cells) for p in NOTEBOOKS}
    wrong = []
    for name in sorted(n for n in dir(fdh) if not n.startswith("_")):
        obj = getattr(fdh, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        said = re.findall(r"Introduced in\s+(\d\d_\w+\.ipynb)", inspect.getdoc(obj) or "")
        if not said:
            continue
        if name in first and said[0] != first[name]:
            wrong.append(f"{name}: says {said[0]}, first called in {first[name]}")
        if name not in first and f"fdh.{name}" not in text.get(said[0], ""):
            wrong.append(f"{name}: says {said[0]}, which neither calls nor names it")
    assert not wrong, "\n".join(wrong)


# --- figures the course cites from this project's committed GPU results --------------------

def test_cited_gpu_figures_are_the_committed_ones():
    """Issue 59, item 10: a GPU figure reaches a lesson through code that reads the rung it names
    (fdh.course.reference_rate, fdh.course.reference_result, fdh.course.reference_numbers), with its TF32 and
    weights; the few an answer quotes are the records' own. No code cell and no visible sentence
    of a core lesson types a committed timing or matmul rate (03's old headline quoted the blog
    ladder's TF32-on "fp32", 3.79 s, as true fp32; 15 held a cell of typed H100 constants)."""
    import json
    import statistics

    from tools import lessons as L

    gpu = ROOT / "results" / "h100-80gb-hbm3"
    rates = [json.loads(line)["bf16_matmul_tflops"]
             for line in (gpu / "matmul.jsonl").read_text().splitlines() if line.strip()]
    assert fdh.course.reference_rate() == ("NVIDIA H100 80GB HBM3", max(rates))
    blog = {r.step: r for r in fdh.load_results(gpu / "sdxl" / "results.jsonl")}
    course = {r.step: r for r in fdh.load_results(gpu / "sdxl-course" / "results.jsonl")}
    committed = [f"{r.latency_s:.2f} s" for r in [*blog.values(), *course.values()]]
    typed = []
    for path in NOTEBOOKS:
        nb = _read(path)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        typed += [f"{path.name}: {rate}" for rate in rates if str(rate) in code]
        if path.name in L.core_path():
            shown = code + L.visible_text(path)
            typed += [f"{path.name}: {s}" for s in committed if s in shown]
    assert not typed, typed
    text = {p.name[:2]: " ".join("\n".join(c.source for c in _read(p).cells).split())
            for p in NOTEBOOKS}
    floors = _read(_by_name("01_"))
    cell = next(c.source for c in floors.cells if c.get("id") == "floors")
    assert "fdh.course.reference_rate()" in cell and 'fdh.course.reference_result("sdxl", "+ SDPA")' in cell
    # the answers that quote a committed figure, with the call that reads it
    samples = course["bf16"].latency_samples
    medians = ", ".join(str(round(statistics.median(samples[:k]), 2)) for k in (3, 5, 10))
    assert f"{medians} and {round(statistics.median(samples), 2)} s" in text["01"], medians
    fp32 = course["fp32, TF32 off"]
    assert f"{fp32.stages['vae_decode']:.3f} s of {fp32.latency_s:.2f} s" in text["01"]
    assert fp32.tf32["matmul"] == "ieee" and blog["fp32"].tf32["matmul"] == "tf32"
    peak = course["bf16"].peak_memory_bytes
    assert peak == course["+ SDPA"].peak_memory_bytes and f"{peak:,} bytes" in text["03"]
    # 10's exercise 1 climbs the course's rungs and reads them through reference_numbers; the
    # order of their own steps that its answer states is the record's (issue 59, defect 11)
    assert ('steps=["fp32, TF32 off", "+ TF32", "bf16", "+ SDPA"], ladder="course")'
            in text["10"])
    assert "TF32 gives the largest one, bf16 the next, and SDPA the smallest" in text["10"]
    rungs = [course[s].latency_s for s in ("fp32, TF32 off", "+ TF32", "bf16", "+ SDPA")]
    own = [before / after for before, after in zip(rungs, rungs[1:])]
    assert own[0] > own[1] > own[2], own


# --- cross-references: each "notebook NN" points at the notebook that now teaches it ------

# What each notebook teaches, in words its own text uses: a "notebook NN" (or an NN in a
# table's notebook column) must stand in a sentence or row that names one of them. The
# course was renumbered once (efcd3ea); 02's closing table kept four old numbers (issue 35).
TEACHES = {
    "00": ("set-up", "environment", "smoke mode"),
    "01": ("baseline", "floor", "FLOPs", "ladder", "what differs"),
    "16": ("profile", "host-side"),
    "02": ("bf16", "fp16", "TF32", "precision"),
    "03": ("attention", "SDPA"),
    "04": ("compile", "inductor", "channels_last", "CUDA graph", "fusion"),
    "05": ("cold start", "cache", "recompile", "regional"),
    "12": ("CUDA graph", "re-record", "capture"),
    "14": ("LoRA",),
    "06": ("fused QKV", "fusion"),
    "07": ("sync", "CPU wait"),
    "08": ("int8", "1x1"),
    "15": ("fp8",),
    "09": ("denoiser calls", "step cache", "guidance"),
    "17": ("all four models", "SD1.5, SSD-1B and PixArt"),
    "10": ("playground", "panel"),
    "18": ("scale out", "batch", "throughput"),
    "11": ("memory", "what fits", "savers"),
    "19": ("Flux",),
    "13": ("autotuning", "max-autotune"),
}
REFERENCE = re.compile(r"\b[Nn]otebooks?\s+(\d\d(?:(?:,\s*|\s+and\s+|\s+or\s+)\d\d)*)"
                       r"(?!\s*-\s*\d)")
RANGE = re.compile(r"\b[Nn]otebooks?\s+\d\d\s*-\s*\d\d")


def _contexts(text: str):
    """(the sentence or table row, [NN, ...]) for each cross-reference in a markdown text: a
    "notebook NN" anywhere, and the numbers of a table's last column headed "notebook"."""
    in_table = False
    # a paragraph, or a list item: a blank line or a line starting "- " or "1. " ends one
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*(?:-|\d+\.) )", text):
        for line in paragraph.splitlines():
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if cells[-1] == "notebook":
                    in_table = True
                elif in_table and re.fullmatch(r"\d\d(,\s*\d\d)*", cells[-1]):
                    yield " | ".join(cells[:-1]), re.findall(r"\d\d", cells[-1])
            else:
                in_table = False
        flat = " ".join(line for line in paragraph.splitlines() if not line.startswith("|"))
        for sentence in re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(*])", flat):
            for found in REFERENCE.finditer(sentence):
                yield sentence, re.findall(r"\d\d", found.group(1))


def _course_texts():
    for path in NOTEBOOKS:
        for cell in _read(path).cells:
            if cell.cell_type == "markdown":
                yield f"{path.name}:{cell.id}", cell.source
            else:  # comments and printed strings of code cells
                yield f"{path.name}:{cell.id}", "\n".join(
                    line for line in cell.source.splitlines() if "otebook" in line)
    yield from doc_texts()


def test_each_notebook_reference_points_at_the_notebook_that_teaches_it():
    titles = {p.name[:2]: "\n".join(c.source for c in _read(p).cells).lower()
              for p in NOTEBOOKS}
    assert sorted(TEACHES) == sorted(titles), "TEACHES lists every notebook"
    unused = {nn: [w for w in words if w.lower() not in titles[nn]]
              for nn, words in TEACHES.items()}
    assert not any(unused.values()), f"words a notebook does not use: {unused}"
    wrong, seen = [], 0
    for where, text in _course_texts():
        wrong += [f"{where}: a range of notebooks ({m.group(0)!r}); name them"
                  for m in RANGE.finditer(text)]
        for context, numbers in _contexts(text):
            for nn in numbers:
                seen += 1
                if nn not in TEACHES:
                    wrong.append(f"{where}: notebook {nn} does not exist ({context[:90]!r})")
                elif not any(w.lower() in context.lower() for w in TEACHES[nn]):
                    wrong.append(f"{where}: notebook {nn} ({TEACHES[nn][0]}...) in "
                                 f"{context[:140]!r}")
    assert seen > 40
    assert not wrong, "\n".join(wrong)


def test_every_notebook_file_named_exists_and_the_syllabus_numbers_match():
    names = {p.name for p in NOTEBOOKS}
    stale = [f"{where}: {found}" for where, text in _course_texts()
             for found in re.findall(r"\b\d\d_\w+\.ipynb", text) if found not in names]
    assert not stale, stale
    rows = re.findall(r"^\| (\d\d) \| \[(\d\d)_\w+\.ipynb\]\(notebooks/(\d\d)_\w+\.ipynb\)",
                      (ROOT / "README.md").read_text(), re.M)
    assert len(rows) == len(NOTEBOOKS) and all(a == b == c for a, b, c in rows), rows
