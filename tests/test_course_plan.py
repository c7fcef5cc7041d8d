"""The course as a student meets it: the plan fits four days of about three hours, every notebook's first cell
states its day, role and minutes as the plan does, opens on the question (no statistics, no plumbing), no code
cell a student sees is over 1,500 characters, and every notebook ends with takeaways."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlo.course.notebooks import source_notebooks
from dlo.course.plan import BOX, DAY_MINUTES, PLAN, day_minutes, entry, plan_table

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p.relative_to(ROOT).as_posix() for p in source_notebooks(ROOT)]
MAX_VISIBLE_CODE = 1500
FIRST_CELL_MAX = 1600
MACHINERY = re.compile(r"signed-rank|Wilcoxon|Mann-Whitney|PROFILES|results\.json|conclude\(|interleav", re.I)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _markdown(path: Path) -> list[str]:
    return [_src(c) for c in _cells(path) if c["cell_type"] == "markdown"]


def test_every_notebook_is_in_the_plan_once_and_the_plan_names_only_notebooks():
    planned = [e.notebook for e in PLAN]
    assert len(planned) == len(set(planned)), "a notebook is in the plan twice"
    assert sorted(planned) == sorted(SOURCES)


@pytest.mark.parametrize("day", sorted({e.day for e in PLAN}))
def test_each_days_core_path_fits_its_practical_time(day):
    assert 0 < day_minutes(day) <= DAY_MINUTES, f"day {day}: core path {day_minutes(day)} min > {DAY_MINUTES}"
    assert all(e.minutes <= DAY_MINUTES for e in PLAN)


def test_the_readme_shows_the_plan():
    assert plan_table() in (ROOT / "README.md").read_text(), "README's course plan differs from dlo.course.plan"


@pytest.mark.parametrize("nb", SOURCES)
def test_first_cell_is_the_question_with_day_role_and_minutes(nb):
    first = _markdown(ROOT / nb)[0]
    assert first.startswith("# "), f"{nb}: the first cell does not open on the notebook's title"
    assert len(first) <= FIRST_CELL_MAX, f"{nb}: first cell {len(first)} characters (> {FIRST_CELL_MAX})"
    assert not MACHINERY.search(first), f"{nb}: the first screen talks about machinery: {MACHINERY.search(first)[0]!r}"
    m = BOX.search(first)
    assert m, f"{nb}: no '**Day N · core|optional** · about **T min** on one GPU (reading R · writing W · running G)' line"
    e = entry(nb)
    assert int(m["day"]) == e.day and (m["role"] == "core") == e.core and int(m["total"]) == e.minutes, \
        f"{nb}: the box says day {m['day']}, {m['role']}, {m['total']} min; the plan says {e}"
    assert int(m["reading"]) + int(m["writing"]) + int(m["running"]) == e.minutes, f"{nb}: the parts do not add up"
    assert re.search(r"you will learn", first, re.I) and re.search(r"you will do", first, re.I), nb


@pytest.mark.parametrize("nb", SOURCES)
def test_no_visible_code_cell_of_the_student_copy_is_over_the_limit(nb):
    student = ROOT / Path(nb).parent / "student" / Path(nb).name
    long = [(i, len(_src(c))) for i, c in enumerate(_cells(student)) if c["cell_type"] == "code"
            and not c.get("metadata", {}).get("jupyter", {}).get("source_hidden") and len(_src(c)) > MAX_VISIBLE_CODE]
    assert not long, f"{student}: visible code cells over {MAX_VISIBLE_CODE} characters (cell, length): {long}"


@pytest.mark.parametrize("nb", SOURCES)
def test_ends_with_takeaways(nb):
    md = _markdown(ROOT / nb)
    tail = [m for m in md[-3:] if re.match(r"##\s+Takeaways", m)]
    assert tail, f"{nb}: no '## Takeaways' cell among the last markdown cells"
    bullets = [line for line in tail[-1].splitlines() if re.match(r"\s*([-*]|\d+\.)\s", line)]
    assert 3 <= len(bullets) <= 5, f"{nb}: {len(bullets)} takeaways (3 to 5)"


@pytest.mark.parametrize("nb", SOURCES)
def test_optional_parts_are_marked(nb):
    """A core notebook whose steps go beyond its core path marks them: a '## Going further' section."""
    md = _markdown(ROOT / nb)
    first = md[0]
    if re.search(r"going further", first, re.I):
        assert any(re.match(r"##\s+Going further", m) for m in md), f"{nb}: the first cell names a 'Going further' part it does not have"
