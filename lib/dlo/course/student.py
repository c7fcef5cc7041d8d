"""Student copies: solution regions replaced by stubs, in notebooks and course scripts.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, Iterable

from dlo.course import catalog
from dlo.course.hints import HELPERS
from dlo.course.hints import goal as step_goal
from dlo.course.notebooks import COURSE_DIRS, _source, dumps, source_notebooks, strip_outputs
from dlo.runtime.paths import ROOT
STUDENT_DIR = "student"

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?::\s*(?P<hint>.*\S))?\s*$")
_END = re.compile(r"^[ \t]*# END SOLUTION\s*$")
_TOP_DEF = re.compile(r"^(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")


# --------------------------------------------------------------------------------------------------
# Which exercise step a solution region belongs to
# --------------------------------------------------------------------------------------------------

def _relative(path: str | Path) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def step_of(source_file: str | Path, name: str | None) -> tuple[str, str] | None:
    """The (course, step) whose checker tests the function or class ``name`` of ``source_file``, if any."""
    rel = _relative(source_file)
    for course, steps in catalog.steps().items():
        for step, chk in steps.items():
            if chk.notebook == rel and name in chk.functions:
                return course, step
    return HELPERS.get(rel, {}).get(name or "")


def solution_regions(source: str) -> list[tuple[str | None, str, str]]:
    """``(enclosing top-level def/class name, outline hint, solution code)`` of every region of ``source``."""
    out: list[tuple[str | None, str, str]] = []
    name: str | None = None
    inside: re.Match | None = None
    body: list[str] = []
    for line in source.splitlines():
        top = _TOP_DEF.match(line)
        if top and inside is None:
            name = top.group("name")
        if inside is None:
            if _BEGIN.match(line):
                inside, body = _BEGIN.match(line), []
        elif _END.match(line):
            out.append((name, inside.group("hint") or "", "\n".join(body)))
            inside = None
        else:
            body.append(line)
    return out


def _stub_text(hint: str | None, where_step: tuple[str, str] | None) -> tuple[str, str]:
    """(comment, NotImplementedError message) of a stub: the step's goal, never the solution's outline."""
    if where_step is None:
        text = hint or "write this part"
        return text, text
    course, step = where_step
    text = step_goal(course, step)
    return text, f"{text} Run `dlo hint {course} {step}` for a hint."


# --------------------------------------------------------------------------------------------------
# Student versions
# --------------------------------------------------------------------------------------------------

def strip_solutions(source: str, where: str = "cell", source_file: str | Path | None = None) -> str:
    """Replace every ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` region of ``source`` by a stub.

    With ``source_file`` (the notebook or script the source comes from), a region inside a function that an
    exercise step checks gets that step's goal (:mod:`dlo.course.hints`) and a pointer to ``dlo hint``; otherwise
    the region's own outline (its ``# BEGIN SOLUTION: ...`` text) is kept.
    """
    out: list[str] = []
    inside: re.Match | None = None
    name: str | None = None
    for lineno, line in enumerate(source.splitlines(), 1):
        begin = _BEGIN.match(line)
        top = _TOP_DEF.match(line)
        if top and inside is None:
            name = top.group("name")
        if inside is None:
            if begin:
                inside = begin
                found = step_of(source_file, name) if source_file is not None else None
                comment, message = _stub_text(begin.group("hint"), found)
                indent = begin.group("indent")
                out.append(f"{indent}# TODO: {comment}")
                if found is not None:
                    out.append(f"{indent}# (run `dlo hint {found[0]} {found[1]}` for a hint)")
                out.append(f"{indent}raise NotImplementedError({message!r})")
            elif _END.match(line):
                raise ValueError(f"{where}, line {lineno}: '# END SOLUTION' without a matching '# BEGIN SOLUTION'")
            else:
                out.append(line)
        else:
            if begin:
                raise ValueError(f"{where}, line {lineno}: nested '# BEGIN SOLUTION' (close the previous region first)")
            if _END.match(line):
                inside = None
    if inside is not None:
        raise ValueError(f"{where}: '# BEGIN SOLUTION' is never closed by '# END SOLUTION'")
    return "\n".join(out)


def has_solutions(source: str) -> bool:
    return any(_BEGIN.match(line) for line in source.splitlines())


def student_path(source_nb: str | Path) -> Path:
    source_nb = Path(source_nb)
    return source_nb.parent / STUDENT_DIR / source_nb.name


def make_student(source_nb: str | Path) -> dict[str, Any]:
    """The student version of a source notebook (as a JSON-able dict)."""
    source_nb = Path(source_nb)
    nb = strip_outputs(json.loads(source_nb.read_text()))
    stubbed = 0
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            src = _source(cell)
            if has_solutions(src):
                new = strip_solutions(src, where=f"{source_nb.name} cell {i}", source_file=source_nb)
                ast.parse(new)  # a stub must leave valid Python behind
                cell["source"] = new
                stubbed += 1
    if stubbed:
        where = "the cells marked `TODO` raise `NotImplementedError` until you write them"
    else:
        scripts = [p.name for p in source_scripts(source_nb.parent.parent) if p.parent == source_nb.parent]
        text = "".join(_source(c) for c in nb["cells"])
        scripts = [name for name in scripts if name in text]  # the script(s) this notebook runs, if any
        named = ", ".join(f"`{name}`" for name in scripts)
        where = (f"your exercises are in {named}, next to this notebook: its parts marked `TODO` raise "
                 "`NotImplementedError` until you write them") if scripts else ""
    if stubbed or where:
        source = (f"> **Exercise version.** Generated from `../{source_nb.name}` by `make student`; {where}. "
                  f"Each exercise has a check cell; from a terminal: `dlo check {source_nb.stem} <step>` "
                  f"(`dlo check --list` shows the steps).")
    else:  # a reading / measuring notebook: nothing to write, and no other file to point at
        source = (f"> **Student copy.** Generated from `../{source_nb.name}` by `make student`. This notebook has "
                  "no exercise to write: run it, then read its measurements and the conclusions drawn from them.")
    banner = {"cell_type": "markdown", "id": "student-banner", "metadata": {"tags": ["student-banner"]},
              "source": source}
    # the first screen stays the notebook's question: the banner goes right after its title cell
    first = nb["cells"][0] if nb["cells"] else None
    at = 1 if first and first["cell_type"] == "markdown" and _source(first).startswith("# ") else 0
    nb["cells"] = nb["cells"][:at] + [banner] + nb["cells"][at:]
    return nb


def make_student_script(source_py: str | Path) -> str:
    """The student version of a course script: solution regions replaced by stubs, a banner on top."""
    source_py = Path(source_py)
    body = strip_solutions(source_py.read_text(), where=source_py.name, source_file=source_py)
    ast.parse(body)  # a stub must leave valid Python behind
    banner = (f"# Exercise version: generated from ../{source_py.name} by `make student` -- edit this copy.\n"
              f"# The parts marked TODO raise NotImplementedError until you write them; "
              f"`dlo check --list` shows their checkers.\n")
    return banner + body + "\n"


def write_students(notebooks: Iterable[str | Path] | None = None, check_only: bool = False) -> list[Path]:
    """(Re)write student notebooks and scripts. With ``check_only``, write nothing and return the stale ones.

    ``notebooks`` defaults to every source notebook and script; ``.py`` paths get a student script.
    """
    stale = []
    sources = notebooks if notebooks is not None else [*source_notebooks(), *source_scripts()]
    for src in sources:
        dst = student_path(src)
        text = make_student_script(src) if Path(src).suffix == ".py" else dumps(make_student(src))
        if not dst.is_file() or dst.read_text() != text:
            stale.append(dst)
            if not check_only:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(text)
    return stale



def source_scripts(root: str | Path = ROOT) -> list[Path]:
    """Every course script (``<folder>/*.py``) that holds solution regions (student copies excluded)."""
    root = Path(root)
    return [py for d in COURSE_DIRS for py in sorted((root / d).glob("*.py")) if has_solutions(py.read_text())]


def source_text(source_file: str | Path) -> list[str]:
    """The code of a notebook's code cells (one string each), or a script's whole text (one string)."""
    path = Path(source_file)
    if path.suffix == ".py":
        return [path.read_text()]
    nb = json.loads(path.read_text())
    return [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]


def step_solution(course: str, step: str) -> list[tuple[str, str, str]]:
    """``(function name, outline, code)`` of every solution region of a step, from its source notebook or script."""
    chk = catalog.find(course, step)  # read from the checkers' source: no torch for `dlo hint` / `dlo solution`
    if chk is None:
        raise ValueError(catalog.unknown_name(course, step, catalog.steps()))
    helpers = {name for name, where in HELPERS.get(chk.notebook, {}).items() if where == (course, step)}
    regions = [r for text in source_text(ROOT / chk.notebook) for r in solution_regions(text)
               if r[0] in chk.functions or r[0] in helpers]
    if not regions:
        raise ValueError(f"{course}/{step}: no solution region found in {chk.notebook}")
    return regions
