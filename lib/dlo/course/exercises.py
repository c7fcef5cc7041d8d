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
