"""Running a notebook: papermill (executed copy in runs/) or plain (its code cells in this Python).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Iterable

from dlo.runtime.paths import RUNS_DIR
from dlo.course.notebooks import NotebookError, _source, parameters_of, resolve_profile
KERNEL_NAME = "dlo"


def _prepare(notebook: str | Path, profile: str, parameters: dict[str, Any] | None,
             out_dir: str | Path | None) -> tuple[Path, dict[str, Any], Path]:
    """Validate a run request; returns (notebook path, parameters to inject, output folder)."""
    notebook = Path(notebook).resolve()
    if not notebook.is_file() or notebook.suffix != ".ipynb":
        raise NotebookError(f"no notebook at {notebook}: give the path of an .ipynb file, e.g. Jour1/jour1.ipynb")
    profile = resolve_profile(profile)
    declared = parameters_of(notebook)
    params = {"profile": profile, **(parameters or {})}
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise NotebookError(f"{notebook.name} has no parameter(s) {', '.join(unknown)}; "
                            f"its parameters are: {', '.join(declared)}")
    out = Path(out_dir).resolve() if out_dir else (RUNS_DIR / notebook.stem).resolve()
    if "out_dir" in declared and "out_dir" not in params:
        params["out_dir"] = str(out)
    return notebook, params, out


def run_notebook(notebook: str | Path, profile: str = "smoke", parameters: dict[str, Any] | None = None,
                 out_dir: str | Path | None = None, kernel_name: str | None = None,
                 log_output: bool = True, timeout_s: float | None = None) -> Path:
    """Execute ``notebook`` with papermill into ``runs/<stem>/<stem>.ipynb`` and return that path.

    The notebook runs in its own folder (as in JupyterLab), gets ``profile`` (and ``out_dir`` when it
    declares that parameter) injected, and any failing cell raises :class:`NotebookError` naming it.
    """
    import papermill as pm

    notebook, params, out = _prepare(notebook, profile, parameters, out_dir)
    out.mkdir(parents=True, exist_ok=True)
    executed = out / notebook.name
    try:
        pm.execute_notebook(str(notebook), str(executed), parameters=params, kernel_name=kernel_name,
                            cwd=str(notebook.parent), log_output=log_output, progress_bar=False,
                            execution_timeout=timeout_s)
    except pm.PapermillExecutionError as exc:
        where = _describe_failed_cell(notebook, executed)
        evalue = str(exc.evalue).splitlines()[0] if exc.evalue else ""
        raise NotebookError(f"{notebook.name}: {where} failed with {exc.ename}: {evalue} "
                            f"-- executed copy: {executed}") from None
    return executed


class _PlainDisplay:
    """Stand-in for ``IPython.display`` when a notebook runs as a plain script: Markdown as text,
    DataFrames (and their Styler) as text tables, anything else through print."""

    class Markdown:
        def __init__(self, data: str = "") -> None:
            self.data = data

        def __str__(self) -> str:
            return self.data

    @staticmethod
    def display(*objs: Any, **_: Any) -> None:
        for obj in objs:
            inner = getattr(obj, "data", None) if obj.__class__.__name__ == "Styler" else None
            print(inner.to_string() if inner is not None else (obj.to_string() if hasattr(obj, "to_string") else obj))


def run_plain(notebook: str | Path, profile: str = "smoke", parameters: dict[str, Any] | None = None,
              out_dir: str | Path | None = None) -> dict[str, Any]:
    """Execute a notebook's code cells in order in this process, without Jupyter (no kernel, no papermill).

    For machines that have torch but no Jupyter stack (a GPU node's bare Python): the code that runs is
    the notebook's own. Parameters are injected after the ``parameters`` cell, as papermill does; the
    value of a cell's last expression is printed, as Jupyter shows it. The cells run in the notebook's
    folder, as in Jupyter (relative paths such as a sibling script resolve the same way). Returns the
    final namespace.
    """
    import os
    import sys
    import types

    import matplotlib

    matplotlib.use("Agg")
    notebook, params, _ = _prepare(notebook, profile, parameters, out_dir)
    fake = types.ModuleType("IPython.display")
    fake.Markdown, fake.display = _PlainDisplay.Markdown, _PlainDisplay.display  # type: ignore[attr-defined]
    try:  # keep the real IPython when there is one (matplotlib and pandas ask it whether a kernel runs)
        import IPython  # noqa: F401
    except ImportError:
        stub = types.ModuleType("IPython")
        stub.get_ipython = lambda: None  # type: ignore[attr-defined]
        sys.modules["IPython"] = stub
    saved = {"IPython.display": sys.modules.get("IPython.display")}
    sys.modules["IPython.display"] = fake
    ns: dict[str, Any] = {"__name__": "__main__", "display": fake.display}
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    cwd = os.getcwd()
    os.chdir(notebook.parent)
    try:
        for number, cell in enumerate(cells, 1):
            src = _source(cell)
            first = next((ln for ln in src.splitlines() if ln.strip()), "empty cell")[:60]
            print(f"--- code cell {number}/{len(cells)}: {first}", flush=True)
            try:
                tree = ast.parse(src)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                exec(compile(tree, f"{notebook.name}[{number}]", "exec"), ns)  # noqa: S102 - course code
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), f"{notebook.name}[{number}]", "eval"), ns)
                    if value is not None and not src.rstrip().endswith(";"):
                        fake.display(value)
                if "parameters" in cell.get("metadata", {}).get("tags", []):
                    ns.update(params)
            except Exception as exc:  # noqa: BLE001 - reported in one line, like run_notebook
                line = str(exc).splitlines()[0] if str(exc) else ""
                raise NotebookError(f"{notebook.name}: code cell {number} ({first}) failed with "
                                    f"{type(exc).__name__}: {line}") from exc
    finally:
        os.chdir(cwd)
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return ns


def _describe_failed_cell(source: Path, executed: Path) -> str:
    """'code cell N (first line)', N counted among the *source* notebook's code cells (1-based)."""
    try:
        cells = json.loads(executed.read_text())["cells"]
        failed = next(c for c in cells if c["cell_type"] == "code"
                      and any(o.get("output_type") == "error" for o in c.get("outputs", [])))
        lines = [ln for ln in _source(failed).splitlines() if ln.strip()]
        first = lines[0][:60] if lines else "empty cell"
        code_ids = [c.get("id") for c in json.loads(source.read_text())["cells"] if c["cell_type"] == "code"]
        if failed.get("id") in code_ids:
            return f"code cell {code_ids.index(failed['id']) + 1} ({first})"
        return f"the injected parameters cell ({first})"
    except (StopIteration, OSError, ValueError, KeyError):
        return "a cell"


def check_clean(notebooks: Iterable[str | Path]) -> list[Path]:
    """Notebooks that carry outputs or execution counts (they should be committed clean)."""
    dirty = []
    for nb_path in notebooks:
        nb = json.loads(Path(nb_path).read_text())
        if any(c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb["cells"]):
            dirty.append(Path(nb_path))
    return dirty
