"""The package stays readable: no module of lib/dlo over 500 lines, no function over 80.

A module that grows past 500 lines has more than one job: split it along the seams it already has (the sections its
own comments draw). A function over 80 lines is several named phases written as one: give each phase a name.
"""
from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib" / "dlo"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_500_lines():
    long = [f"{p.relative_to(LIB)} ({n} lines)" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 500 lines (split them along their sections): " + ", ".join(long)


def test_no_function_is_over_80_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(LIB)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines (name their phases): " + ", ".join(long)
