"""The public API is what the course uses (issue 52): `fdh.__all__` lists every public name the
package offers, and each is called in a notebook or named on a documentation page as fdh.<name>."""

from __future__ import annotations

import json
import re
import types

from doc_pages import ROOT, doc_texts

import fastdiff_helpers as fdh


def _public(module) -> set[str]:
    """The public names a module offers, less its subpackages and modules but the course
    layer's one name, fdh.course."""
    return {n for n in dir(module) if not n.startswith("_")
            and (n == "course" or not isinstance(getattr(module, n), types.ModuleType))}


def _course_text() -> str:
    cells = ["".join(c["source"]) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
             for c in json.loads(p.read_text(encoding="utf-8"))["cells"]]
    return "\n".join(cells + [text for _, text in doc_texts()])


def _unused(names, text: str) -> list[str]:
    """Names neither called nor named as fdh.<name> in `text` (fdh.LADDERS does not count for
    LADDER)."""
    return sorted(n for n in names if not re.search(rf"\bfdh\.{re.escape(n)}(?!\w)", text))


def test_the_course_layer_is_one_name_and_each_of_its_names_is_used():
    """Issue 58: what runs the course is reached through fdh.course (fdh.course.settings(...)),
    so a cell shows which calls a participant takes home; each of its names is called or named
    as fdh.course.<name> in a notebook or on a page, and none is also fdh's own."""
    from fastdiff_helpers import course

    assert "course" in fdh.__all__ and fdh.course is course
    assert not set(course.__all__) & set(fdh.__all__), set(course.__all__) & set(fdh.__all__)
    unused = _unused([f"course.{n}" for n in course.__all__], _course_text())
    assert not unused, f"{unused}: no notebook calls them and no page names them"
    old = sorted({m for m in re.findall(r"\bfdh\.(\w+)", _course_text())
                  if m in course.__all__ or m == "course_settings"})
    assert not old, f"the course's names written as fdh's own: {old}"


def test_all_lists_every_public_name_once():
    assert len(fdh.__all__) == len(set(fdh.__all__))
    assert set(fdh.__all__) == _public(fdh), (
        f"public but not in __all__: {sorted(_public(fdh) - set(fdh.__all__))}; "
        f"in __all__ but not public: {sorted(set(fdh.__all__) - _public(fdh))}")


def test_every_public_name_is_used_in_a_notebook_or_documented():
    unused = _unused(fdh.__all__, _course_text())
    assert not unused, (f"{unused}: no notebook calls them and no page names them as fdh.<name>; "
                        "use or document them (docs/helpers.md, 'The rest of the public API'), "
                        "or take them out of the API")


def test_the_use_check_reads_whole_names():
    text = "fdh.LADDERS[...] and fdh.load_pipeline(...); load_results without its prefix"
    assert _unused(["LADDER", "LADDERS", "load_pipeline", "load_results"], text) == [
        "LADDER", "load_results"]


def test_notebooks_call_the_package_through_its_api():
    """A notebook's cells, and the code in its exercises, use `fdh.<name>`, never an import from
    inside the package: what a lesson needs is public."""
    reaching = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if re.search(r"^\s*(from|import) fastdiff_helpers\.",
                         "".join(cell["source"]), re.M):
                reaching.append(path.name)
    assert not reaching, reaching


def test_every_public_name_has_an_example_on_the_helpers_page():
    """Issue 58: each name fdh exports has one example in docs/helpers.md: a line of its code
    (the one-screen block) or a code span that uses fdh.<name>, not the bare name."""
    page = (ROOT / "docs" / "helpers.md").read_text(encoding="utf-8")
    snippets = [line for block in re.findall(r"```python\n(.*?)```", page, re.S)
                for line in block.splitlines()] + re.findall(r"`([^`\n]+)`", page)
    missing = [n for n in fdh.__all__ if not any(
        re.search(rf"\bfdh\.{re.escape(n)}(?!\w)", s) and s.strip() != f"fdh.{n}"
        for s in snippets)]
    assert not missing, f"{missing}: no example of these in docs/helpers.md"


def test_the_package_names_only_routes_that_exist():
    """Every `fdh.<name>` the package's own text writes (a refusal's next step, a docstring, a
    printed line) is a name fdh has, or `fdh.course.<name>` one the course layer has, so a
    message never sends a participant to a call that raises AttributeError. Before, a refusal
    of fdh.course.reference_result said `fdh.reference_numbers(model)`, and env_report printed
    `fdh.env.FLOORS`."""
    from fastdiff_helpers import course

    modules = ("course", "models", "techniques", "measure", "results")
    wrong = []
    for path in sorted((ROOT / "fastdiff_helpers").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"(?<![\w.])fdh\.(\w+)(?:\.(\w+))?", text):
            name, attr = m.groups()
            if name == "course" and attr and attr not in course.__all__:
                wrong.append(f"{path.relative_to(ROOT)}: fdh.course.{attr}")
            elif name not in fdh.__all__ and name not in modules:
                wrong.append(f"{path.relative_to(ROOT)}: fdh.{name}")
    assert not wrong, "names the package writes that fdh does not have:\n" + "\n".join(wrong)
