"""Loading a student's exercises: the definitions of a notebook's ``setup``/``exercise`` cells or of a course script.

Kept apart from the checkers on purpose: the multi-process checkers start 2 to 4 processes that each load the
student's script, and importing :mod:`dlo.course.checks` (every course's checkers, with torchvision,
transformers and the rest behind them) would cost each process seconds before any check runs.
"""
from __future__ import annotations

import json
import linecache
import os
from pathlib import Path
from typing import Any


def load_exercises(notebook: str | os.PathLike) -> dict[str, Any]:
    """Execute a notebook's ``setup`` and ``exercise`` cells (imports and function definitions only).

    A course script (``.py``) is executed whole as a module named ``__exercises__``: its
    ``if __name__ == "__main__":`` part does not run, so only its imports and definitions happen.
    """
    if Path(notebook).suffix == ".py":
        path = Path(notebook).resolve()  # checkers may start processes that import the same file
        ns = {"__name__": "__exercises__", "__file__": str(path)}
        exec(compile(path.read_text(), str(path), "exec"), ns)  # noqa: S102 - course code
        return ns
    nb = json.loads(Path(notebook).read_text())
    ns: dict[str, Any] = {"__name__": "__exercises__"}
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and ({"setup", "exercise"} & set(tags)):
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            name = f"{Path(notebook).name}:{tags}:{id(cell)}"
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # the source, for inspect
            exec(compile(src, name, "exec"), ns)  # noqa: S102 - course code
    return ns


__all__ = ["load_exercises"]


def write_answer(fn: Any, folder: Path, name: str) -> Path:
    """Write what a multi-process check's processes run (:func:`read_answer` reads it back): the source text of the
    cell or file that defines ``fn`` (``<name>.py``) or, where no source text is kept (a notebook run by the plain
    engine, which compiles each cell's syntax tree), ``fn``'s compiled code (``<name>.code``: the processes are forked
    from this interpreter, so the bytecode format is the same). ValueError when ``fn`` is not a plain function."""
    import marshal

    code = getattr(fn, "__code__", None)
    if code is None:
        raise ValueError(f"{name} must be a plain function (def {name}(...): ...)")
    lines = linecache.getlines(code.co_filename)
    if not lines and Path(code.co_filename).is_file():
        lines = Path(code.co_filename).read_text().splitlines(True)
    if lines:
        path = Path(folder) / f"{name}_answer.py"
        path.write_text("".join(lines))
    else:
        path = Path(folder) / f"{name}_answer.code"
        path.write_bytes(marshal.dumps((code, fn.__defaults__)))  # the defaults travel too (e.g. group=None)
    return path


def read_answer(path: str, ns: dict[str, Any], name: str) -> Any:
    """In a check's process: the function ``name`` that :func:`write_answer` wrote to ``path``, defined in ``ns``
    (the names the answer may use)."""
    import marshal
    import types

    if path.endswith(".code"):
        with open(path, "rb") as f:
            code, defaults = marshal.loads(f.read())  # written by the checker itself, in this interpreter
        ns[name] = types.FunctionType(code, ns, name, defaults)
    else:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)  # noqa: S102 - the student's answer, checked
    return ns[name]
