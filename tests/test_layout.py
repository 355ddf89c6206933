"""The house (issue 14): imports flow one way, one home for each shared piece, files that stay
readable. Read from the source with ast, so the test needs no import of the package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fastdiff_helpers"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


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
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            if c in MODULES and c != name:
                found.append((c, node.lineno, id(node) in top))
    return found


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


def test_lower_floors_import_nothing_of_the_package():
    """The floors import nothing of the package but the one error class beneath them all
    (errors.py, which imports nothing)."""
    for name in ("models.presets", "techniques.recipe", "measure.record", "measure.quality",
                 "measure.env", "errors", "results.text", "models.noise",
                 "measure.compile_events"):
        imported = {t for t, _, _ in _imports(f"fastdiff_helpers.{name}")}
        imported.discard("fastdiff_helpers.errors")
        assert not imported, f"{name} imports {sorted(imported)}"
    assert not _imports("fastdiff_helpers.errors")


def test_package_imports_are_at_module_level():
    """Imports of the package's own modules sit at the top of the file: a local one hides a
    dependency (or a circle)."""
    local = [f"{MODULES[n].relative_to(PACKAGE.parent)}:{line} imports {t}"
             for n in MODULES for t, line, top in _imports(n) if not top]
    assert not local, "\n".join(local)


def test_files_stay_readable():
    long = {p.relative_to(PACKAGE.parent).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 320}
    assert not long, f"files over 320 lines (split along a topic): {long}"


def _all_recipes():
    import dataclasses

    import fastdiff_helpers as fdh

    recipes = [r for _, r in fdh.LADDER + fdh.COURSE_LADDER]
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
