"""The documentation a reader finds by name (issue 46): the README, a landing page, and the pages
under docs/ it links, in the order a reader meets them. Every test that reads the README's
commands, code, notebook references, corrected phrases or tables reads each of these files, so a
command or a figure that moves from one page to another stays tested (test_readme.py,
test_course_text.py, test_clock.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [ROOT / "docs" / name for name in
         ("running.md", "hosted.md", "helpers.md", "workshop.md", "instructor.md", "offline-gpu.md",
          "layout.md", "history.md", "glossary.md")]
DOCS = [README, *PAGES]


def doc_texts() -> list[tuple[str, str]]:
    """(the file's path in the checkout, its text) for each documentation file, in order."""
    return [(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
            for path in DOCS]
