"""The house (issue 14): imports flow one way, one home for each shared piece, files that stay
readable. Read from the source with ast, so the test needs no import of the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fastdiff_helpers"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` reads from, its dots resolved against `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported package module, line, at module level) for every import in `name`'s file,
    function bodies included."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            # `from .. import checks` imports the module checks, not the package's __init__
            submodules = [f"{target}.{a.name}" for a in node.names
                          if f"{target}.{a.name}" in MODULES]
            candidates = submodules or [target]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            if c in MODULES and c != name:
                found.append((c, node.lineno, id(node) in top))
    return sorted(found)


def _edges() -> dict[str, set[str]]:
    edges = {}
    for name in MODULES:
        targets = set()
        for target, _, _ in _imports(name):
            # importing a package's __init__ from inside that package is Python's own mechanics
            if MODULES[target].name == "__init__.py" and name.startswith(target + "."):
                continue
            targets.add(target)
        edges[name] = targets
    return edges


def test_no_import_circle():
    edges = _edges()
    circles = []

    def visit(node, path):
        for nxt in sorted(edges[node]):
            if nxt in path:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for name in sorted(MODULES):
        if MODULES[name].name != "__init__.py":
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(sorted(set(circles))[:10])


# The model data is three floor modules: the records (spec), the blog's four models (presets)
# and Flux.1 (flux); presets gathers them into fdh.MODELS.
FLOOR_DATA = {"models.presets": {"fastdiff_helpers.models.spec", "fastdiff_helpers.models.flux"},
              "models.flux": {"fastdiff_helpers.models.spec"},
              # the recipe's dtype names and hardware thresholds are the one dtype vocabulary's
              # (issues 46, 52), which the course's GPU profiles read too
              "techniques.recipe": {"fastdiff_helpers.models.dtypes"}}


def test_lower_floors_import_nothing_of_the_package():
    """The floors import nothing of the package but the one error class beneath them all
    (errors.py, which imports nothing) and, for the model data, the other data floors."""
    for name in ("models.presets", "models.spec", "models.flux", "techniques.recipe",
                 "measure.record", "measure.quality", "measure.env", "errors",
                 "models.noise", "measure.compile_events",
                 "course.planning.published",
                 "models.dtypes"):
        imported = {t for t, _, _ in _imports(f"fastdiff_helpers.{name}")}
        imported.discard("fastdiff_helpers.errors")
        imported -= FLOOR_DATA.get(name, set())
        assert not imported, f"{name} imports {sorted(imported)}"
    assert not _imports("fastdiff_helpers.errors")


# The subpackages by role (issue 25), lowest first; errors.py and checks.py are the ground beneath
# them all. A module imports from its own subpackage, the ground, and the layers below its own.
LAYERS = ("models", "techniques", "measure", "results", "course.planning", "course.compiletime",
          "course", "course.runs")
GROUND = {"errors", "checks"}
TOP_LEVEL = {"__init__", "__main__"} | GROUND


def _place(module: str) -> str:
    """'models' for fastdiff_helpers.models.loading, 'errors' for fastdiff_helpers.errors,
    '' for the package itself."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in LAYERS:  # the course layer's own subpackages
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else ""


def test_every_module_sits_in_a_subpackage():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(loose) <= TOP_LEVEL, f"modules outside a subpackage: {sorted(set(loose) - TOP_LEVEL)}"
    assert len(TOP_LEVEL - {"__init__", "__main__"}) <= 2
    subpackages = sorted(".".join(p.parent.relative_to(PACKAGE).parts)
                         for p in PACKAGE.glob("**/__init__.py") if p.parent != PACKAGE)
    assert subpackages == sorted(LAYERS), subpackages


def test_layers_import_only_downwards():
    """A lower layer imports nothing of a higher one, function bodies included; the ground imports
    only errors.py. (The package's __init__ and __main__ sit above everything.)"""
    wrong = []
    for name in MODULES:
        here = _place(name)
        if here in ("", "__main__"):
            continue
        for target, line, _ in _imports(name):
            there = _place(target)
            if there == here:
                continue
            if here in GROUND:
                ok = there == "errors"
            else:
                ok = there in GROUND or (there in LAYERS and LAYERS.index(there) < LAYERS.index(here))
            if not ok:
                wrong.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} ({here}) "
                             f"imports {target} ({there or 'the package'})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_circle_between_subpackages():
    graph = {}
    for name, targets in _edges().items():
        for target in targets:
            a, b = _place(name), _place(target)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,)))
                   for n in graph.get(start, ()))

    circles = sorted(a for a in graph if reaches(a, a))
    assert not circles, f"subpackages on an import circle: {circles}"


def test_each_subpackage_docstring_names_its_modules():
    """The one docstring per subpackage says what each of its modules holds: a new module is
    listed where it lands."""
    for layer in LAYERS:
        folder = PACKAGE.joinpath(*layer.split("."))
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        modules = sorted(p.stem for p in folder.glob("*.py")
                         if not p.stem.startswith("_"))
        missing = [m for m in modules if m != "__init__" and not re.search(rf"^\s+{m}\b", doc, re.M)]
        assert not missing, f"{layer}/__init__.py's docstring does not list {missing}"


def test_the_layout_page_names_every_module():
    """docs/layout.md's map of the package names each module (the name as a word, so
    course_downloads does not stand for models/downloads) and every notebook's range."""
    page = (PACKAGE.parent / "docs" / "layout.md").read_text()
    block = page.split("fastdiff_helpers/  the package", 1)[1].split("notebooks/", 1)[0]
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p.stem != "__init__")
    missing = [p.relative_to(PACKAGE.parent).as_posix() for p in modules
               if not re.search(rf"(?<![\w]){re.escape(p.stem)}(?![\w])", block)]
    assert not missing, f"docs/layout.md does not name {missing}"
    last = sorted((PACKAGE.parent / "notebooks").glob("*.ipynb"))[-1].stem
    assert f"... {last}" in page, f"docs/layout.md's notebooks line does not end at {last}"


def _private_imports(name: str, source: str | None = None) -> list[tuple[str, str, int]]:
    """(the module imported from, the private name, line) for every import in `name`'s file of a
    name starting with "_" (dunders aside): `from ..x import _y`, `from fastdiff_helpers.x import
    _y`, `import fastdiff_helpers.x._y`. The name imported counts, not the alias: a public name
    imported `as _z` is public."""
    path = MODULES.get(name)
    package = name if path and path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            if target.split(".")[0] != "fastdiff_helpers":
                continue
            for alias in node.names:
                parts = target.split(".") + [alias.name]
                private = [p for p in parts if p.startswith("_") and not p.endswith("__")]
                if private:
                    found.append((target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "fastdiff_helpers" and any(
                        p.startswith("_") and not p.endswith("__") for p in parts):
                    found.append((alias.name, alias.name, node.lineno))
    return sorted(found)


def test_no_module_imports_another_subpackages_private_names():
    """A subpackage's private names (and private modules, techniques/_state.py) are its own: no
    other subpackage (nor the package's __init__) imports them. What a cell or a notebook does
    is asked of planning publicly (clock.cell_work, plan.card_work; issue 51)."""
    wrong = []
    for name in MODULES:
        here = _place(name)
        for target, imported, line in _private_imports(name):
            if _place(target) != here:
                where = MODULES[name].relative_to(PACKAGE.parent)
                wrong.append(f"{where}:{line} ({here or 'the package'}) imports {imported} "
                             f"from {target}")
    assert not wrong, "private names imported across subpackages:\n" + "\n".join(wrong)


def test_the_private_import_check_reads_names_not_aliases():
    """The check above, on a probe: a private name from another subpackage is caught, a public
    name under a private alias and a private name of its own subpackage are not."""
    probe = ("from ..models.meta import meta_copy as _copy\n"
             "from ..models.meta import _hidden\n"
             "from fastdiff_helpers.techniques import _state\n"
             "from . import _own\n")
    found = _private_imports("fastdiff_helpers.measure.probe", probe)
    across = [(imported, line) for target, imported, line in found if _place(target) != "measure"]
    assert across == [("_hidden", 2), ("_state", 3)]


def test_package_imports_are_at_module_level():
    """Imports of the package's own modules sit at the top of the file: a local one hides a
    dependency (or a circle)."""
    local = [f"{MODULES[n].relative_to(PACKAGE.parent)}:{line} imports {t}"
             for n in MODULES for t, line, top in _imports(n) if not top]
    assert not local, "\n".join(local)


def _all_recipes():
    import dataclasses

    import fastdiff_helpers as fdh

    recipes = [r for _, r in fdh.course.LADDER + fdh.course.COURSE_LADDER]
    base = fdh.Recipe(dtype="bf16", attention="sdpa-flash", fuse_qkv=True, compile="default")
    recipes += [dataclasses.replace(base, **change) for change in (
        dict(compile_scope="regional"), dict(compile_scope="regional-extended"),
        dict(compile_scope="regional-accelerate"), dict(dynamic=True), dict(no_sync=True),
        dict(quantize="int8-dynamic", quant_filter="fastdiff", conv1x1_to_linear="all"),
        dict(quantize="int8-weight-only", quant_filter="all"), dict(tf32="guide"))]
    return recipes


def test_plain_code_uses_no_private_attribute():
    """to_code(recipe, "plain") is what users paste: public APIs only. Modules whose name starts
    with '_' are imported under a name (torch._inductor.config, where inductor's flags live, and
    torch.fx.experimental._config for the guide's duck-shape switch); no attribute access
    reaches into a private name."""
    import fastdiff_helpers as fdh

    for recipe in _all_recipes():
        code = fdh.to_code(recipe, "plain")
        private = sorted({node.attr for node in ast.walk(ast.parse(code))
                          if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                          and not node.attr.endswith("__")})  # dunders are Python's own API
        assert not private, (recipe, private)


COURSE_LAYER = ("course",)  # the course's own machinery: course/ and its planning, compiletime, runs


def test_importing_the_package_loads_nothing_of_the_course_layer():
    """Issue 58: `import fastdiff_helpers` loads the core (models, techniques, measure,
    results) and none of the course layer; `fdh.course` is its one name, and reaching it loads
    nothing more than course/__init__.py; a course name (fdh.course.<name>) loads its module
    on first use and is that module's own object. Before, the import loaded 33 course-layer
    modules and the course's 27 names were fdh's own."""
    import subprocess
    import sys

    probe = ("import json, sys\n"
             "import fastdiff_helpers as fdh\n"
             f"layer = {COURSE_LAYER!r}\n"
             "def loaded():\n"
             "    return sorted(m for m in sys.modules if m.startswith('fastdiff_helpers.')\n"
             "                  and m.split('.')[1] in layer)\n"
             "first = loaded()\n"
             "course = fdh.course\n"
             "reached = loaded()\n"
             "settings = fdh.course.settings\n"
             "print(json.dumps([first, reached, loaded(), sorted(fdh.__all__),\n"
             "                  sorted(dir(fdh)), sorted(dir(fdh.course))]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=PACKAGE.parent, env={"PYTHONPATH": str(PACKAGE.parent),
                                                   "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    first, reached, after, public, listed, course_listed = json.loads(
        done.stdout.strip().splitlines()[-1])
    assert first == [], first
    assert reached == ["fastdiff_helpers.course"], reached
    assert "fastdiff_helpers.course.parameters" in after
    assert set(public) <= set(listed) and "course" in public
    import importlib

    import fastdiff_helpers as fdh
    from fastdiff_helpers import course

    assert set(course.__all__) <= set(course_listed)
    assert fdh.course.settings is importlib.import_module(
        "fastdiff_helpers.course.parameters").course_settings
    for name, (module, attr) in course._API.items():
        assert module.split(".")[0] in COURSE_LAYER, (name, module)
        assert getattr(fdh.course, name) is getattr(importlib.import_module(
            f"fastdiff_helpers.{module}"), attr), name
        assert name not in fdh.__all__, f"{name}: a course name is fdh.course.{name}, not fdh's"
    homes = {n: getattr(getattr(fdh, n), "__module__", None) or "" for n in fdh.__all__
             if n != "course"}
    eager = {n: m for n, m in homes.items()
             if m.startswith("fastdiff_helpers.") and m.split(".")[1] in COURSE_LAYER}
    assert not eager, f"course names imported eagerly: {eager}"


# Where a model's family may be worked out from the pipeline itself: loading.py describes a
# pipeline loaded another way from its class (pipeline_info) and finds its denoiser
# (get_denoiser); meta.py builds a bare denoiser's inputs from its config (no pipeline there).
FAMILY_FROM_THE_PIPELINE = {"models/loading.py", "models/meta.py"}
# Functions whose own source is the plain code fdh.to_code prints: a participant's copy has no
# spec to read, so it decides by the pipeline's class as diffusers names it.
PLAIN_CODE_FUNCTIONS = {"techniques/syncs.py": {"no_sync_plan"}}


def family_decisions(source: str, skip: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, what) for each place `source` decides a model's family other than by its spec
    (ModelSpec.family, loading.family_of): by a class name, a denoiser attribute, a config key,
    a model key's spelling or the denoiser's attribute name; the functions named in `skip`
    left out."""
    found = []
    tree = ast.parse(source)
    skipped = [range(n.lineno, n.end_lineno + 1) for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef) and n.name in skip]

    def class_name(node) -> bool:  # type(pipe).__name__, type(get_denoiser(pipe)).__name__
        if not (isinstance(node, ast.Attribute) and node.attr == "__name__"
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "type" and node.value.args):
            return False
        of = node.value.args[0]
        return (getattr(of, "id", None) in ("pipe", "pipeline", "denoiser")
                or getattr(getattr(of, "func", None), "id", None) == "get_denoiser")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (getattr(func, "id", None) == "hasattr" and len(node.args) == 2
                    and getattr(node.args[1], "value", None) in ("unet", "transformer")):
                found.append((node.lineno, "hasattr(pipe, 'unet')"))
            if isinstance(func, ast.Attribute) and func.attr == "startswith":
                if class_name(func.value):
                    found.append((node.lineno, "type(x).__name__.startswith"))
                if node.args and getattr(node.args[0], "value", None) == "flux":
                    found.append((node.lineno, "key.startswith('flux')"))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(class_name(s) for s in sides):
                found.append((node.lineno, "type(x).__name__ compared"))
            constants = {getattr(s, "value", None) for s in sides}
            if {"joint_attention_dim", "caption_channels"} & constants:
                found.append((node.lineno, "a config key"))
            if any(isinstance(s, ast.Tuple) and "flux-schnell" in
                   {getattr(e, "value", None) for e in s.elts} for s in sides):
                found.append((node.lineno, "model keys listed"))
            if any(isinstance(s, ast.Attribute) and s.attr == "denoiser" for s in sides) and \
                    constants & {"unet", "transformer"}:
                found.append((node.lineno, "spec.denoiser compared"))
    return sorted(f for f in found if not any(f[0] in lines for lines in skipped))


def test_the_model_family_is_read_from_the_spec_alone():
    """Issue 58: a model spec states its family once (ModelSpec.family) and every helper reads
    it (spec.family, family_of(pipe), pipeline_spec(pipe).denoiser); none decides it by the
    pipeline's class name, a denoiser attribute, a config key or a model key's spelling. Before,
    about 30 places in 14 files did."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where in FAMILY_FROM_THE_PIPELINE:
            continue
        wrong += [f"{where}:{line} ({what})" for line, what in family_decisions(
            path.read_text(encoding="utf-8"), PLAIN_CODE_FUNCTIONS.get(where, set()))]
    assert not wrong, "the family decided other than from the spec:\n" + "\n".join(wrong)
    import fastdiff_helpers as fdh

    plain = fdh.to_code(fdh.Recipe(no_sync=True), "plain")
    for names in PLAIN_CODE_FUNCTIONS.values():
        assert all(f"def {name}(" in plain for name in names), names  # still printed


def test_the_family_check_sees_each_way():
    source = ('if type(pipe).__name__.startswith("PixArt"): pass\n'
              'x = "unet" if hasattr(pipe, "unet") else "transformer"\n'
              'y = "joint_attention_dim" in cfg\n'
              'z = model in ("flux", "flux-schnell")\n'
              'w = key.startswith("flux")\n'
              'v = spec.denoiser == "unet"\n'
              'u = type(pipe).__name__ == "FluxPipeline"\n'
              't = type(get_denoiser(pipe)).__name__ != "PixArtTransformer2DModel"\n'
              'ok = spec.family == "flux"; s = "hasattr(pipe, \'unet\')"\n'
              'ok = [m for m in module.modules() if type(m).__name__ == "PermuteSandwich"]\n')
    assert [line for line, _ in family_decisions(source)] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert family_decisions("def plain(pipe):\n    return hasattr(pipe, 'unet')\n",
                            {"plain"}) == []
