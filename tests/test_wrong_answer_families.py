"""Every wrong answer of the corpora that name their families says which family of mistake it belongs to.

The first line of such a wrong answer's docstring reads ``Family: <name>. <what is wrong>``, and ``<name>`` is one of
the families listed once, in bold, in the corpus's README.md (``- **<name>**: ...``). A family listed but never used
is dropped from the list.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORPUS = Path(__file__).with_name("wrong_answers")
#: The corpora (courses) whose wrong answers name their family.
NAMED = ("tp",)
LINE = re.compile(r"Family: ([^.]+)\. \S")


def _families(course: str) -> list[str]:
    return re.findall(r"^- \*\*(.+?)\*\*", (CORPUS / course / "README.md").read_text(), flags=re.M)


def _family_of(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = LINE.match(doc)
    return match.group(1) if match else None


@pytest.mark.parametrize("course", NAMED)
def test_every_wrong_answer_names_a_listed_family(course):
    listed = _families(course)
    assert len(listed) == len(set(listed)), f"{course}/README.md lists a family twice: {listed}"
    answers = sorted(p for p in CORPUS.glob(f"{course}/*/*.py") if not p.name.startswith("ok_"))
    assert answers
    unnamed = [p.relative_to(CORPUS).as_posix() for p in answers if _family_of(p) is None]
    assert not unnamed, f"wrong answers whose docstring does not start with 'Family: <name>. ': {unnamed}"
    unknown = {p.relative_to(CORPUS).as_posix(): _family_of(p) for p in answers if _family_of(p) not in listed}
    assert not unknown, f"families not listed in {course}/README.md: {unknown}"
    unused = set(listed) - {_family_of(p) for p in answers}
    assert not unused, f"families listed in {course}/README.md but never used: {sorted(unused)}"
