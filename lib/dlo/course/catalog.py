"""Every exercise step's checked functions and source file, read from the checkers' source text.

``dlo hint``, ``dlo solution``, ``dlo check --list`` and the student copies need only that table, not the checkers:
importing those loads torch, torch.distributed and torchvision (seconds, on every call). So the checker modules
(``dlo/course/checks/*.py``) are parsed with :mod:`ast` instead, and each ``@register(course, step, functions,
notebook)`` decorator gives one step, in the order in which importing ``dlo.course.checks`` registers them.
``tests/test_catalog.py`` keeps this table equal to ``dlo.course.checks.REGISTRY``.

A decorator's arguments must be readable without running the module: literals, or module-level constants built
from literals (``SCRIPT = "tp_fsdp/fsdp_train.py"``, ``+`` and f-strings of those, names imported from another
checker module); anything else is a :class:`CatalogError` naming the file and line.
"""
from __future__ import annotations

import ast
from difflib import get_close_matches
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
_PARAMS = ("course", "step", "functions", "notebook")  # register()'s parameters, in order
_PACKAGE = "dlo.course.checks"


class Step(NamedTuple):
    course: str
    step: str
    functions: tuple[str, ...]
    notebook: str  # source notebook or script, relative to the project root


class CatalogError(ValueError):
    """A ``@register(...)`` decorator whose arguments cannot be read from the source text."""


class _Unresolved(Exception):
    """An expression that is not a literal or a known constant (turned into a CatalogError with its place)."""


def steps(checks_dir: str | Path = CHECKS_DIR) -> dict[str, dict[str, Step]]:
    """Returns ``{course: {step: Step}}`` in registration order, as ``REGISTRY`` holds it, without importing it."""
    return _catalog(Path(checks_dir).resolve())


def unknown_name(course: str, step: str | None, table: Mapping[str, Iterable[str]]) -> str | None:
    """None when ``course`` (and ``step``, if given) are in ``table`` ({course: steps}); else one line saying which
    name is unknown, the closest known names ("did you mean") and where the list is."""
    if course not in table:
        close = get_close_matches(course, list(table), n=2)
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        return f"unknown course {course!r}: {guess}the courses are {', '.join(sorted(table))}"
    if step is not None and step not in table[course]:
        close = get_close_matches(step, list(table[course]), n=2)
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        return f"unknown step {step!r} of {course}: {guess}its steps are {', '.join(table[course])}"
    return None


def find(course: str, step: str, checks_dir: str | Path = CHECKS_DIR) -> Step | None:
    """Returns the :class:`Step` ``course``/``step``, or None if no checker registers it."""
    return steps(checks_dir).get(course, {}).get(step)


@lru_cache(maxsize=None)
def _catalog(checks_dir: Path) -> dict[str, dict[str, Step]]:
    table: dict[str, dict[str, Step]] = {}
    _Reader(checks_dir, table).module("__init__")
    return table


class _Reader:
    """Walks the checker modules the way ``import dlo.course.checks`` runs them: statements in order, a checker
    module imported by another one read first where that import stands (each once), decorators bottom-up."""

    def __init__(self, checks_dir: Path, table: dict[str, dict[str, Step]]) -> None:
        self.dir, self.table = checks_dir, table
        self.done: dict[str, dict[str, object]] = {}  # module name -> its constants

    def module(self, name: str) -> dict[str, object]:
        """Returns the module-level constants of checker module ``name``, registering its steps on first read."""
        if name in self.done:
            return self.done[name]
        path = self.dir / f"{name}.py"
        constants: dict[str, object] = {}
        self.done[name] = constants
        if not path.is_file():  # a subpackage or a missing module: nothing registered there
            return constants
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            self._statement(node, path, constants)
        return constants

    def _statement(self, node: ast.stmt, path: Path, constants: dict[str, object]) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    _assign(constants, target.id, node.value)
                else:  # unpacking: never a constant, and no earlier value of these names holds any more
                    _forget(constants, target)
        elif isinstance(node, ast.AugAssign):
            _forget(constants, node.target)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._import(node, constants)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for deco in reversed(node.decorator_list):  # the decorator nearest the def runs first
                if _is_register(deco):
                    self._register(deco, path, constants)
            constants.pop(node.name, None)

    def _import(self, node: ast.Import | ast.ImportFrom, constants: dict[str, object]) -> None:
        for alias in node.names:  # the names it binds are no constants of this module (unless shown below)
            constants.pop((alias.asname or alias.name).split(".")[0], None)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(_PACKAGE + "."):
                    self.module(alias.name[len(_PACKAGE) + 1:].split(".")[0])
            return
        if node.level == 1 and node.module is None:  # from . import a, b: sibling modules
            for alias in node.names:
                self.module(alias.name)
            return
        if node.level == 1:
            source = node.module.split(".")[0]
        elif node.level == 0 and (node.module or "").startswith(_PACKAGE + "."):
            source = node.module[len(_PACKAGE) + 1:].split(".")[0]
        else:
            return  # not a checker module: registers nothing
        theirs = self.module(source)
        for alias in node.names:  # a constant imported from another checker module is a constant here too
            if alias.name in theirs:
                constants[alias.asname or alias.name] = theirs[alias.name]

    def _register(self, call: ast.Call, path: Path, constants: dict[str, object]) -> None:
        where = f"{path}:{call.lineno}"
        args = _bind(call, where)
        values = {}
        for param, node in args.items():
            try:
                values[param] = _value(node, constants)
            except _Unresolved as exc:
                raise CatalogError(f"{where}: @register argument {param}={ast.unparse(node)} cannot be resolved "
                                   f"statically ({exc}): use a literal or a module-level constant built from "
                                   "literals") from None
        step = _check_types(Step(**values), where)
        self.table.setdefault(step.course, {})[step.step] = step


def _assign(constants: dict[str, object], name: str, node: ast.expr) -> None:
    """Records ``name`` as a constant if its value is static; else forgets any earlier value (it was rebound)."""
    try:
        constants[name] = _value(node, constants)
    except _Unresolved:
        constants.pop(name, None)


def _forget(constants: dict[str, object], target: ast.expr) -> None:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            constants.pop(node.id, None)


def _is_register(deco: ast.expr) -> bool:
    """True for ``@register(...)`` and ``@<module>.register(...)``."""
    if not isinstance(deco, ast.Call):
        return False
    func = deco.func
    return (isinstance(func, ast.Name) and func.id == "register") or \
        (isinstance(func, ast.Attribute) and func.attr == "register")


def _bind(call: ast.Call, where: str) -> dict[str, ast.expr]:
    """Returns register()'s arguments by parameter name, from positional and keyword arguments."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise CatalogError(f"{where}: @register(*args / **kwargs) cannot be read statically: name each argument")
    if len(call.args) > len(_PARAMS):
        raise CatalogError(f"{where}: @register takes {len(_PARAMS)} arguments ({', '.join(_PARAMS)})")
    args = dict(zip(_PARAMS, call.args))
    for kw in call.keywords:
        if kw.arg not in _PARAMS or kw.arg in args:
            raise CatalogError(f"{where}: @register got an unexpected or repeated argument {kw.arg!r}")
        args[kw.arg] = kw.value
    missing = [p for p in _PARAMS if p not in args]
    if missing:
        raise CatalogError(f"{where}: @register is missing {', '.join(missing)}")
    return args


def _value(node: ast.expr, constants: dict[str, object]) -> object:
    """Returns the value of a literal expression, with names looked up in ``constants``; raises _Unresolved."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(e, constants) for e in node.elts)
    if isinstance(node, ast.Name):
        if node.id not in constants:
            raise _Unresolved(f"{node.id} is not a module-level constant of literals")
        return constants[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, constants), _value(node.right, constants)
        if type(left) is not type(right):
            raise _Unresolved(f"{ast.unparse(node)} adds a {type(left).__name__} and a {type(right).__name__}")
        return left + right
    if isinstance(node, ast.JoinedStr):
        return "".join(_fstring_part(v, constants) for v in node.values)
    raise _Unresolved(f"{type(node).__name__} is not a literal")


def _fstring_part(node: ast.expr, constants: dict[str, object]) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.FormattedValue) and node.conversion == -1 and node.format_spec is None:
        return str(_value(node.value, constants))
    raise _Unresolved(f"f-string part {ast.unparse(node)} uses a conversion or a format")


def _check_types(step: Step, where: str) -> Step:
    """Returns ``step`` if its fields have register()'s types; raises CatalogError otherwise."""
    if not all(isinstance(v, str) for v in (step.course, step.step, step.notebook)):
        raise CatalogError(f"{where}: @register's course, step and notebook must be strings")
    if not isinstance(step.functions, tuple) or not all(isinstance(f, str) for f in step.functions):
        raise CatalogError(f"{where}: @register's functions must be a tuple of names")
    return step
