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
import math
from pathlib import Path
from typing import Any, Mapping

from dlo.runtime.paths import ROOT

COURSE_DIRS = ("Jour1", "Jour2", "Jour3", "Jour4", "tp_fsdp", "tp_pipeline", "tp_tensor_parallel")
PROFILES = ("smoke", "full", "dry")


class NotebookError(RuntimeError):
    """A notebook could not be run; the message is one line naming the cell and the error."""


class NotebookArgumentError(NotebookError, ValueError):
    """A run request that cannot start: no such notebook, an unknown parameter, a value of the wrong type, an
    output folder that cannot be written. Raised before any kernel starts; ``dlo run`` exits with 2 for it."""


# The first lines of every course notebook (its ``setup`` cell): opened with another kernel than "Python (dlo)",
# the notebook stops at once with one line saying what to do, instead of a ModuleNotFoundError further down.
KERNEL_GUARD = (
    "try:  # without the course's kernel, say which one to pick\n"
    "    import dlo\n"
    "except ModuleNotFoundError as e:\n"
    "    class WrongKernel(Exception):  # shown by Jupyter as this one line, without a traceback\n"
    "        _render_traceback_ = lambda self: [str(self)]\n"
    "    raise (WrongKernel if \"get_ipython\" in globals() else SystemExit)(\n"
    "        f\"{e}: select the kernel 'Python (dlo)' (Kernel > Change Kernel...); \"\n"
    "        \"not in the list? see 'JupyterHub' in README.md\") from None\n"
)


def resolve_profile(profile: str) -> str:
    """'smoke' | 'full' | 'dry' | 'auto' (full when a CUDA GPU is visible, else smoke) -> 'smoke', 'full' or 'dry'.

    'dry' is the full profile rehearsed on a CPU: the full profile's lists, choices and branches, with only the
    sizes that make it long scaled down (see :func:`profile_settings`), so that a crash in code that only the
    full profile reaches shows up in minutes on a laptop or in CI, not hours into a GPU job."""
    if profile == "auto":
        import torch

        return "full" if torch.cuda.is_available() else "smoke"
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: use 'smoke' (CPU, minutes, tiny data), "
                         "'full' (GPU node, real sizes), 'dry' (the full profile's code paths on a CPU, scaled "
                         "down) or 'auto'")
    return profile


def is_full(profile: str) -> bool:
    """Whether ``profile`` takes the full profile's code paths ('full', and its CPU rehearsal 'dry')."""
    return resolve_profile(profile) in ("full", "dry")


def profile_settings(profiles: Mapping[str, Mapping[str, Any]], profile: str) -> dict[str, Any]:
    """The settings a notebook runs with, from its ``PROFILES`` table.

    'smoke' and 'full' are their own entries. 'dry' is ``PROFILES["full"]`` with the overrides of
    ``PROFILES["dry"]``: by convention, only sizes (data, widths, steps, repeats, a list's *length*) are
    overridden there, never what decides which code runs; a key that the full profile does not have is an
    error (a typo would otherwise rehearse nothing). Every call returns a new dict."""
    name = resolve_profile(profile)
    if name != "dry":
        return dict(profiles[name])
    if "dry" not in profiles:
        raise ValueError("this notebook has no 'dry' profile (PROFILES['dry'], the full profile's size overrides)")
    unknown = sorted(set(profiles["dry"]) - set(profiles["full"]))
    if unknown:
        raise ValueError(f"PROFILES['dry'] overrides {', '.join(unknown)}, which the full profile does not have")
    return {**profiles["full"], **profiles["dry"]}


def _kind(value: Any) -> str:
    """"number" (ints and floats mix), "bool", "list" (or tuple), "dict", "any" (None: no value yet), else the type."""
    if value is None:
        return "any"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        return "list"
    return "dict" if isinstance(value, Mapping) else type(value).__name__


def profile_differences(reference: Mapping[str, Any], other: Mapping[str, Any],
                        names: tuple[str, str] = ("smoke", "full"), where: str = "") -> list[str]:
    """Where ``other`` does not have the shape of ``reference``: a key in one only, nested dicts included, or a
    value of another kind (:func:`_kind`; None matches anything). One line each, e.g. ``"sizes: number in smoke,
    list in full"``. The smoke profile is what CI runs, so a key that only the full profile lacks (a KeyError on a
    GPU node, hours into a job) or a list where smoke has a number would otherwise first show on a GPU."""
    a, b = names
    out = [f"{where}{k}: in {a} only" for k in reference if k not in other]
    out += [f"{where}{k}: in {b} only" for k in other if k not in reference]
    for key in (k for k in reference if k in other):
        x, y = reference[key], other[key]
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += profile_differences(x, y, names, f"{where}{key}.")
        elif "any" not in (_kind(x), _kind(y)) and _kind(x) != _kind(y):
            out.append(f"{where}{key}: {_kind(x)} in {a}, {_kind(y)} in {b}")
    return out


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


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict, "tuple": tuple,
          "None": type(None)}


def _annotation_types(node: ast.expr | None) -> tuple[type, ...] | None:
    """``int | None`` -> (int, NoneType); ``list[int]`` -> (list,); None for what is not a plain builtin type.

    Quoted annotations are read too: the notebooks write ``"Optional[int]"``, the form papermill's parameter parser
    (``papermill --help-notebook``) understands, where it skips ``int | None``."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and node.value is None:
        return (type(None),)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        try:
            return _annotation_types(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(node, ast.Name):
        return (_TYPES[node.id],) if node.id in _TYPES else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation_types(node.left), _annotation_types(node.right)
        return left + right if left and right else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id == "Optional":
            inner = _annotation_types(node.slice)
            return inner + (type(None),) if inner else None
        if node.value.id == "Union" and isinstance(node.slice, ast.Tuple):
            parts = [_annotation_types(e) for e in node.slice.elts]
            return tuple(t for part in parts for t in part) if all(parts) else None
        return _annotation_types(node.value)
    return None


def _parameters_cell(nb_path: str | Path) -> list[tuple[str, Any, tuple[type, ...] | None]]:
    """(name, default, accepted types) for each assignment of the notebook's ``parameters`` cell."""
    nb = json.loads(Path(nb_path).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            found = []
            for node in ast.parse(_source(cell)).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    target, value, annotation = node.targets[0], node.value, None
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    target, value, annotation = node.target, node.value, node.annotation
                else:
                    continue
                try:
                    default = ast.literal_eval(value)
                except ValueError:
                    default = ast.unparse(value)
                types = _annotation_types(annotation)
                if types is None and annotation is None and default is not None:
                    types = (type(default),)
                found.append((target.id, default, types))
            return found
    raise NotebookError(f"{nb_path} has no cell tagged 'parameters': add the tag to its first code cell")


def parameters_of(nb_path: str | Path) -> dict[str, Any]:
    """Names and default values of the notebook's ``parameters`` cell (literals only)."""
    return {name: default for name, default, _ in _parameters_cell(nb_path)}


def parameter_types(nb_path: str | Path) -> dict[str, tuple[type, ...] | None]:
    """The types each parameter accepts: its annotation (``batch_size: int | None = None``), else the type of its
    default (``seed = 0``: int); None when neither says (a ``None`` default without an annotation)."""
    return {name: types for name, _, types in _parameters_cell(nb_path)}


def _accepts(types: tuple[type, ...], value: Any) -> bool:
    if isinstance(value, bool):  # True is an int to Python, not to a notebook parameter
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _finite(value: Any) -> bool:
    """False for a float that is inf or NaN, also inside a list, tuple or dict."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def check_parameter_types(nb_path: str | Path, parameters: dict[str, Any]) -> None:
    """NotebookArgumentError, in one line naming the parameter, the expected type and the value, for the first
    value that its parameters cell says it cannot take (checked before a kernel starts, not minutes later)."""
    declared = parameter_types(nb_path)
    for name, value in parameters.items():
        if not _finite(value):
            raise NotebookArgumentError(f"parameter {name} of {Path(nb_path).name}: {value!r} is not a finite number "
                                        f"(give a value such as 80 or 0.5)")
        types = declared.get(name)
        if types and not _accepts(types, value):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            hint = " (quote a text value: -p NAME \"'text'\")" if str in types else ""
            raise NotebookArgumentError(f"parameter {name} of {Path(nb_path).name} expects {expected}, "
                                        f"not {value!r} ({type(value).__name__}){hint}")


def parse_value(text: str) -> Any:
    """Command-line parameter values: Python/JSON literals when they parse (1, 0.5, True, None, [1, 2]), else str."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        low = text.lower()
        if low in ("true", "false", "null", "none"):
            return {"true": True, "false": False}.get(low)
        return text


#: The Jupyter stack: a notebook's plain run (``dlo run --engine plain``) needs none of it, a GPU node may lack it.
JUPYTER_STACK = frozenset({"IPython", "ipykernel", "ipywidgets", "nbformat", "nbclient", "papermill", "jupyter",
                           "jupyter_client"})


def imported_packages(nb_path: str | Path) -> list[str]:
    """The top-level packages a notebook's code cells import unconditionally (``import optuna``, ``from ray import
    tune``): statements at a cell's top level or under ``if``/``with``, not those under ``try`` (an optional import
    handled by the cell) nor inside functions. Sorted, without duplicates."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
            elif isinstance(node, (ast.If, ast.With, ast.For)):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    for cell in json.loads(Path(nb_path).read_text())["cells"]:
        if cell["cell_type"] == "code":
            try:
                visit(ast.parse(_source(cell)).body)
            except SyntaxError:  # a cell with IPython magics: not a plain-Python cell
                continue
    found.discard("__future__")
    return sorted(found)


def missing_packages(nb_path: str | Path, *, ignore: frozenset[str] = JUPYTER_STACK) -> list[str]:
    """The packages :func:`imported_packages` names that this Python cannot import (``ignore``: those the plain
    engine stands in for, i.e. ``IPython.display``). A GPU node may have torch, transformers, pandas, matplotlib
    and tqdm only: ``dlo gpu-check --quick`` skips, with this list as the reason, a notebook that needs Optuna or
    Ray there, instead of reporting it as failed."""
    import importlib.util

    missing = []
    for name in imported_packages(nb_path):
        if name in ignore:
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing
