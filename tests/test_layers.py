"""The package's architecture, pinned: each folder of ``lib/dlo`` is one layer, imports go one way (a module
imports only from its own layer or the layers below), there is no import cycle, and a function imports
inside its body only the optional heavy dependencies (never another dlo module)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "dlo"
# lowest first; see the README's module table
LAYERS = ["runtime", "data", "models", "measure", "training", "parallel", "lessons", "course", "cli"]


def _module(path: Path) -> str:
    parts = path.relative_to(LIB).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("dlo", *parts))


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package root
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(dlo module imported, at top level?, line) for every import of a dlo module in ``path``."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dlo"):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                is_module = (LIB / Path(*target.split(".")[1:])).with_suffix(".py").exists() or \
                    (LIB / Path(*target.split(".")[1:]) / "__init__.py").exists()
                out.append((target if is_module else node.module, id(node) in top, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append(("<relative>", id(node) in top, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, id(node) in top, node.lineno) for a in node.names if a.name.startswith("dlo")]
    return out


FILES = sorted(LIB.rglob("*.py"))


def test_every_module_is_in_a_layer():
    outside = [str(p.relative_to(LIB)) for p in FILES if p.parent == LIB and p.stem not in ("__init__", "__main__", "cli")]
    assert not outside, f"modules outside the layer folders: {outside}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(LIB)))
def test_imports_go_down(path):
    me = _module(path)
    mine = _layer(me)
    for target, at_top, line in _imports(path):
        if path.name == "__init__.py" and target == "<relative>":
            continue  # a folder's facade re-exports its own modules
        assert target != "<relative>", f"{me}:{line}: use absolute `dlo.` imports"
        if me == "dlo":
            continue
        theirs = _layer(target)
        assert theirs is not None or target in ("dlo",), f"{me}:{line} imports {target}, outside the layers"
        if theirs is not None and mine is not None:
            assert theirs <= mine, f"{me}:{line} imports {target}: {LAYERS[theirs]} is above {LAYERS[mine]}"
        if me != "dlo.cli":  # the command line imports a subcommand only when it runs (`dlo train` needs no Jupyter)
            assert at_top, f"{me}:{line} imports {target} inside a function: dlo modules are imported at the top"


def test_no_import_cycle():
    graph: dict[str, set[str]] = {}
    for path in FILES:
        me = _module(path)
        deps = set()
        for target, at_top, _ in _imports(path):
            if target.startswith("dlo.") and at_top:
                deps.add(target)
        graph[me] = deps
    # a package's facade is imported with its modules: `dlo.x.y` depends on `dlo.x`
    for me in list(graph):
        parts = me.split(".")
        for i in range(2, len(parts)):
            graph[me].add(".".join(parts[:i]))
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                if not all(c in graph[c2] or True for c, c2 in zip(cycle, cycle[1:])):
                    continue
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if state.get(dep) is None:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state.get(node) is None:
            visit(node)


def test_import_dlo_stays_light():
    """`import dlo` and the training layer must not pull in the heavy optional libraries."""
    code = ("import sys, dlo, dlo.training, dlo.data, dlo.models, dlo.runtime; "
            "heavy = [m for m in ('ray', 'deepspeed', 'optuna', 'transformers', 'mlflow', 'papermill') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"import dlo loads heavy libraries: {out.stdout.strip()}"
