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
from pathlib import Path
from typing import Any

from dlo.runtime.paths import ROOT

COURSE_DIRS = ("Jour1", "Jour2", "Jour3", "Jour4", "tp_fsdp", "tp_pipeline", "tp_tensor_parallel")
PROFILES = ("smoke", "full")


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
