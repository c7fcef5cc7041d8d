"""Run notebooks in batch (papermill) and generate the student versions of the exercise notebooks.

Source notebooks hold the solutions. Inside a code cell, a solution region is written::

    # BEGIN SOLUTION: wrap the forward pass and the loss in torch.autocast
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    # END SOLUTION

and the student version replaces it with a stub at the same indentation::

    # TODO: wrap the forward pass and the loss in torch.autocast
    raise NotImplementedError("wrap the forward pass and the loss in torch.autocast")

``dlo student`` (``make student``) rewrites every ``<folder>/student/<name>.ipynb`` from
``<folder>/<name>.ipynb``; a test fails when a committed student notebook is stale.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any, Iterable

from .paths import ROOT, RUNS_DIR

COURSE_DIRS = ("Jour1", "Jour2", "Jour3", "Jour4", "tp_fsdp", "tp_pipeline", "tp_tensor_parallel")
PROFILES = ("smoke", "full")
STUDENT_DIR = "student"
KERNEL_NAME = "dlo"

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?::\s*(?P<hint>.*\S))?\s*$")
_END = re.compile(r"^[ \t]*# END SOLUTION\s*$")


class NotebookError(RuntimeError):
    """A notebook could not be run; the message is one line naming the cell and the error."""


def resolve_profile(profile: str) -> str:
    """'smoke' | 'full' | 'auto' (full when a CUDA GPU is visible, else smoke) -> 'smoke' or 'full'."""
    if profile == "auto":
        import torch

        return "full" if torch.cuda.is_available() else "smoke"
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: use 'smoke' (CPU, minutes, tiny data), "
                         "'full' (GPU node, real sizes) or 'auto'")
    return profile


# --------------------------------------------------------------------------------------------------
# Student versions
# --------------------------------------------------------------------------------------------------

def strip_solutions(source: str, where: str = "cell") -> str:
    """Replace every ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` region of ``source`` by a stub."""
    out: list[str] = []
    inside: re.Match | None = None
    for lineno, line in enumerate(source.splitlines(), 1):
        begin = _BEGIN.match(line)
        if inside is None:
            if begin:
                inside = begin
                hint = begin.group("hint") or "write this part"
                indent = begin.group("indent")
                out.append(f"{indent}# TODO: {hint}")
                out.append(f"{indent}raise NotImplementedError({hint!r})")
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


def strip_outputs(nb: dict[str, Any]) -> dict[str, Any]:
    """Remove outputs and execution counts (committed notebooks carry none)."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        for key in ("execution", "papermill"):
            cell.get("metadata", {}).pop(key, None)
    nb.get("metadata", {}).pop("papermill", None)
    return nb


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


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
                new = strip_solutions(src, where=f"{source_nb.name} cell {i}")
                ast.parse(new)  # a stub must leave valid Python behind
                cell["source"] = new
                stubbed += 1
    if stubbed:
        where = "the cells marked `TODO` raise `NotImplementedError` until you write them"
    else:
        scripts = [p.name for p in source_scripts(source_nb.parent.parent) if p.parent == source_nb.parent]
        named = ", ".join(f"`{name}`" for name in scripts) or "the script next to this notebook"
        where = (f"your exercises are in {named}, next to this notebook: its parts marked `TODO` raise "
                 "`NotImplementedError` until you write them")
    banner = {
        "cell_type": "markdown", "id": "student-banner", "metadata": {"tags": ["student-banner"]},
        "source": (f"> **Exercise version.** Generated from `../{source_nb.name}` by `make student`; {where}. "
                   f"Each exercise has a check cell; from a terminal: `dlo check {source_nb.stem} <step>` "
                   f"(`dlo check --list` shows the steps)."),
    }
    nb["cells"] = [banner] + nb["cells"]
    return nb


def dumps(nb: dict[str, Any]) -> str:
    """Stable JSON text for a notebook (same layout as Jupyter: indent 1, sorted keys, trailing newline)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def source_notebooks(root: str | Path = ROOT) -> list[Path]:
    """Every course notebook (``<folder>/*.ipynb``; the copies in ``student/`` excluded).

    Each gets a student copy, even one whose exercises live in a script next to it (e.g. Jour2/ddp.ipynb
    and ddp_train.py): the student notebook must sit next to the student script it runs.
    """
    root = Path(root)
    return [nb for d in COURSE_DIRS for nb in sorted((root / d).glob("*.ipynb"))]


def source_scripts(root: str | Path = ROOT) -> list[Path]:
    """Every course script (``<folder>/*.py``) that holds solution regions (student copies excluded)."""
    root = Path(root)
    return [py for d in COURSE_DIRS for py in sorted((root / d).glob("*.py")) if has_solutions(py.read_text())]


def make_student_script(source_py: str | Path) -> str:
    """The student version of a course script: solution regions replaced by stubs, a banner on top."""
    source_py = Path(source_py)
    body = strip_solutions(source_py.read_text(), where=source_py.name)
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


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------

def parameters_of(nb_path: str | Path) -> dict[str, Any]:
    """Names and default values of the notebook's ``parameters`` cell (literals only)."""
    nb = json.loads(Path(nb_path).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            values: dict[str, Any] = {}
            for node in ast.parse(_source(cell)).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        values[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        values[node.targets[0].id] = ast.unparse(node.value)
            return values
    raise NotebookError(f"{nb_path} has no cell tagged 'parameters': add the tag to its first code cell")


def parse_value(text: str) -> Any:
    """Command-line parameter values: Python/JSON literals when they parse (1, 0.5, True, None, [1, 2]), else str."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        low = text.lower()
        if low in ("true", "false", "null", "none"):
            return {"true": True, "false": False}.get(low)
        return text


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
