"""The course as a workshop day (issue 50): each notebook labelled with its track and minutes, on a
one-day core path that fits about 5 hours on an H100; each lesson short, its provenance folded;
exercises with minutes and a folded answer; terms in a glossary. The rules and the arithmetic are
tools/lessons.py; `.venv/bin/python -m tools.lessons --write` puts the labels
and the README's columns in line with them. Fast: the notebooks are read, not run."""

from __future__ import annotations

import functools
import re
import statistics
from pathlib import Path

import pytest

from tools import lessons as L

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = L.notebooks()
GLOSSARY = ROOT / "docs" / "glossary.md"
# terms the course uses that a participant who knows PyTorch may not (issue 50: used before
# taught, or never explained); each has its entry in docs/glossary.md
TERMS = ("dynamo", "inductor", "graph", "graph break", "guard", "recompile", "fusion",
         "epilogue", "GEMM", "SM", "tensor core", "CUDA graph", "autotuning", "SDPA", "TF32",
         "bf16", "fp16", "fp8", "int8", "PSNR", "rung", "denoising step", "cold start",
         "smoke mode", "est.",
         # issue 59: used on the core path or printed by it, now each in the glossary
         "compute capability", "course clock", "tuning bundle", "coordinate descent", "ladder",
         "frame", "FX graph cache hit", "SSIM", "sync", "quantization", "recipe",
         "graph partition, static input")


@functools.lru_cache(maxsize=1)
def _lessons() -> dict[str, L.Lesson]:
    return {lesson.name: lesson for lesson in L.lessons()}


def _ids(paths):
    return [p.name for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_the_first_cell_labels_track_and_minutes(path):
    lesson = _lessons()[path.name]
    said = L.label(path)
    assert said is not None, (f"{path.name}: the first line after the title is not "
                              f"'{lesson.label}'")
    assert said == (lesson.track, lesson.minutes, lesson.t4_minutes), (
        f"{path.name} says {said}, the course computes {lesson.label} (reading "
        f"{lesson.reading_min:.1f} + est. GPU wait {lesson.wait_min:.1f} / "
        f"{lesson.t4_wait_min:.1f} + exercises {lesson.exercise_min} / "
        f"{lesson.t4_exercise_min} min): run `.venv/bin/python -m tools.lessons --write`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_the_first_cell_names_the_lessons_downloads(path):
    """Issue 59, item 8: the line after the label says what the lesson downloads the first time,
    from the course's own plan of downloads; the set-up notebook says the whole day's."""
    said = L.downloads_said(path)
    assert said == L.downloads_line(path.name, L.core_path()), (f"{path.name}: run `python -m fastdiff_helpers "
                                                 "lessons --write`")


def test_the_downloads_lines_say_what_each_lesson_adds():
    """On the course's record: 00 loads SDXL in fp32 (its fp16 files on a T4); 02 adds its fp16
    files (bf16 rungs), nothing on a T4; 07, SD1.5's; 03 adds nothing; the set-up notebook
    totals the core path, less on a T4."""
    from fastdiff_helpers.course.planning.course_downloads import course_downloads

    # on a T4, where SDXL's fp32 does not fit, 00 loads the half-precision files 02 adds (issue 59)
    assert L.downloads_line("00_setup.ipynb", L.core_path()).startswith(
        "Downloads: SDXL fp32 weights (13.9 GB), the first time; on a T4, SDXL fp16 weights "
        "(6.9 GB). The whole core path downloads ")
    day = sum(r[2] for r in course_downloads(L.core_path())) / 1e9
    assert f"downloads {day:.1f} GB on an H100" in L.downloads_line("00_setup.ipynb", L.core_path())
    assert L.downloads_line("02_precision.ipynb", L.core_path()) == (
        "Downloads: SDXL fp16 weights (6.9 GB), the first time; on a T4, nothing new.")
    assert L.downloads_line("03_attention.ipynb", L.core_path()).startswith("Downloads: nothing new")
    assert L.downloads_line("07_gpu_syncs.ipynb", L.core_path()).startswith("Downloads: SD1.5 fp16 weights")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_each_lesson_is_short(path):
    lesson = _lessons()[path.name]
    limit = L.CORE_WORDS if lesson.track == "core" else L.OPTIONAL_WORDS
    assert lesson.words <= limit, (f"{path.name}: {lesson.words} visible words, {lesson.track} "
                                   f"lessons have at most {limit}: fold provenance and caveats "
                                   "in <details>, or move them to docs/")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_the_project_stays_out_of_the_visible_text(path):
    text = L.visible_text(path)
    py = re.findall(r"[\w./-]+\.py\b", text)
    assert len(py) <= 2, f"{path.name}: {len(py)} .py paths in visible text: {py}"
    assert "tests/" not in text, f"{path.name}: a tests/ path in visible text"
    status = re.findall(r"(?:not|never)\s+(?:yet\s+)?(?:been\s+)?(?:run|measured|tested)\s+on\s+"
                        r"(?:a|any|the)\s+GPU", text, re.I)
    assert not status, f"{path.name}: test status in visible text: {status}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_sentences_are_short(path):
    lengths = L.sentence_lengths(L.visible_text(path))
    over = [n for n in lengths if n > 45]
    assert statistics.median(lengths) <= 25, f"{path.name}: median sentence {statistics.median(lengths)} words"
    assert len(over) <= 0.05 * len(lengths), (
        f"{path.name}: {len(over)} of {len(lengths)} sentences over 45 words: "
        + " | ".join(s[:80] for s in L.sentences(L.visible_text(path)) if len(s.split()) > 45))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_exercises_have_minutes_a_label_and_a_folded_answer(path):
    found = L.exercises(path)
    assert found, (f"{path.name}: no exercise in the form '**1. Title** · 5 min · CPU' under "
                   "'## Exercises'")
    assert [e.number for e in found] == list(range(1, len(found) + 1)), found
    unanswered = [e.title for e in found if not e.answered]
    assert not unanswered, f"{path.name}: no folded '<details><summary>Answer' for {unanswered}"
    assert all(1 <= e.minutes <= 20 for e in found), [(e.title, e.minutes) for e in found]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_folded_blocks_are_titled_and_folded(path):
    text = "\n".join(L._markdown(path))
    opened = len(re.findall(r"<details\b", text, re.I))
    titles = L.SUMMARY.findall(text)
    assert len(titles) == opened, f"{path.name}: a <details> block without a <summary> title"
    assert not re.search(r"<details[^>]*\bopen\b", text, re.I), f"{path.name}: a block opened"
    assert text.count("</details>") == opened, f"{path.name}: unbalanced <details>"
    short = [t for t in titles if len(re.sub(r"<[^>]+>", "", t).split()) < 1]
    assert not short, f"{path.name}: an untitled block"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_each_lesson_links_the_glossary(path):
    assert "../docs/glossary.md" in L.visible_text(path), (
        f"{path.name}: no link to the glossary (../docs/glossary.md)")


def test_each_core_lesson_leads_to_the_next_core_lesson():
    path = L.core_path()
    for name, following in zip(path, path[1:] + [None]):
        last = L._markdown(L.NOTEBOOKS / name)[-1]
        if following is None:
            assert "](../README.md" in last, f"{name}: the day's last lesson links the README"
        else:
            links = re.findall(r"\]\((\d\d_\w+\.ipynb)\)", last.split("## Summary")[-1])
            assert links and links[-1] == following, (
                f"{name}: its summary's last link is {links[-1:]}, the next core lesson is "
                f"{following}")


def test_the_core_path_fits_a_workshop_day():
    found = list(_lessons().values())
    core = [x for x in found if x.track == "core"]
    assert [x.name for x in core] == L.core_path()
    assert sum(x.words for x in core) <= L.PATH_WORDS
    assert sum(x.words for x in found) <= L.COURSE_WORDS
    assert L.path_minutes(found) <= 315, L.table(found)  # fits about 5 h, as labelled


# Core cells over the limit since the clock costs a compile at SDXL's measured 47 ms an op
# (110.8 s for the UNet and VAE decode on the H200, results/h200/slot-2026-11-29.md) in place
# of 19 ms scaled from Flux's published figure: each compiles two or more new full-size graphs
# in one call (two recompiles; the step cache's two paths; the plain and the all-three
# recipes). Their lessons must be restructured (issue 61's note); the list is exact, so a new
# slow cell fails here, and so does a mended one until it leaves. (08's two rungs in one cell
# are under the limit since '+ no sync' counts as the cache hit it measured.)
KNOWN_SLOW = {"05_cold_start.ipynb:recompile-report",
              "09_fewer_denoiser_calls.ipynb:nb12-15", "09_fewer_denoiser_calls.ipynb:nb12-21"}


def test_no_core_cell_waits_more_than_three_minutes_on_an_h100():
    from fastdiff_helpers.course.planning import clock

    run = clock.estimate(notebooks=L.core_path())["notebooks"]
    slow = {f"{nb}:{cell}": round(c["total_s"] / 60, 1) for nb, n in run.items()
            for cell, c in n["cells"].items() if c["total_s"] > L.CELL_WAIT_S}
    assert set(slow) == KNOWN_SLOW, slow


def test_a_cells_estimated_wait_is_the_clocks_on_an_h100_and_the_plans_on_a_t4():
    """A core lesson that says how long the next code cell waits says it for both cards the
    labels name, as lessons.wait_words writes the course clock's estimate (H100) and the
    plan's (T4) of that cell (issue 59, defect 15: five said an H100 figure alone, typed)."""
    import nbformat

    from tools.lessons import cell_waits, wait_words

    wait = r"(?:under a minute|[\d.]+ min)"
    said = re.compile(rf"est\. {wait} on an H100(?:, {wait} on a T4)?")
    waits = cell_waits(L.core_path())
    found, wrong = 0, []
    for path in NOTEBOOKS:
        if path.name not in waits:
            continue
        cells = nbformat.read(path, as_version=4).cells
        for i, cell in enumerate(cells):
            if cell.cell_type != "markdown":
                continue
            for phrase in said.findall(" ".join(cell.source.split())):
                after = next(c for c in cells[i + 1:] if c.cell_type == "code")
                wanted = wait_words(*waits[path.name][after.id])
                found += 1
                if phrase != wanted:
                    wrong.append(f"{path.name}:{cell.id} says {phrase!r}, the clock {wanted!r}")
    assert found >= 6 and not wrong, wrong


def test_the_readme_shows_the_day():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == L.syllabus_columns(readme, list(_lessons().values())), (
        "the README's syllabus columns or core path line differ: run `.venv/bin/python -m "
        "tools.lessons --write`")
    rows = L.SYLLABUS_ROW.findall(readme)
    assert [r[0] for r in rows] == [p.name[:2] for p in NOTEBOOKS]
    assert L.PATH_LINE.search(readme)


def test_the_glossary_explains_each_term():
    text = GLOSSARY.read_text(encoding="utf-8")
    entries = {m.lower() for m in re.findall(r"^\*\*(.+?)\*\*", text, re.M)}
    missing = [t for t in TERMS if t.lower() not in entries]
    assert not missing, f"docs/glossary.md has no '**term**' entry for {missing}"


def test_the_rules_catch_what_they_look_for():
    """The text rules on a made-up lesson (a test that cannot fail would prove nothing)."""
    md = ("# 99 · Title\n\n**Core · 25 min on an H100, 40 on a T4**\n\nShort one. Another short one.\n\n"
          "<details><summary>Where this comes from</summary>\n\ntorch/_inductor/utils.py "
          "decides it.\n\n</details>\n\n```python\nx = 1  # code is not prose\n```\n")
    text = L.visible(md)
    assert "utils.py" not in text and "code is not prose" not in text
    assert L.words(text) == 20  # the title and the label count
    assert L.sentence_lengths(text) == [2, 3]
    assert L.LABEL.match("**Optional · 15 min on an H100, 25 on a T4**")
    assert not L.LABEL.match("**Optional · 15 min**")  # the T4's minutes too (issue 59)
    head = "**2. Three sizes** · 5 min on an H100, 8 on a T4 · CPU or GPU"
    assert L.EXERCISE.match(head).groups() == ("2", "Three sizes", "5", "8", "CPU or GPU")
    assert not L.EXERCISE.match("**2. Three sizes** · 5 min · CPU or GPU")
    assert L.Lesson("x", "core", 0, 1.0, 0.5, 0).minutes == 5
    assert L.Lesson("x", "core", 0, 7.0, 3.5, 10).minutes == 25
    lesson = L.Lesson("x", "core", 0, 7.0, 3.5, 10, t4_wait_min=20.0, t4_exercise_min=14)
    assert (lesson.minutes, lesson.t4_minutes) == (25, 45)
    assert lesson.label == "**Core · 25 min on an H100, 45 on a T4**"
