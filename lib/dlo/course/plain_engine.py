"""The plain engine of ``dlo run --plain``: a notebook's code cells run in order in this Python, without Jupyter.

Displays come out as text and figures as PNG files (:class:`_PlainOutput`, a stand-in for ``IPython.display``);
in a batch log, what the cells print goes through :class:`dlo.course.notebook_stream.LineFilter` and a silent cell
gets a ``still running`` line. :func:`dlo.course.runner.run_plain` checks the request, then calls
:func:`execute_plain`.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from dlo.course.notebooks import NotebookError, _source
from dlo.course.notebook_stream import LineFilter, _Watchdog, _cell_line, _first_line
from dlo.runtime import progress


class _PlainOutput:
    """What a notebook displays, as text, when its cells run as a plain script (``run_plain``).

    It stands in for ``IPython.display`` (``display``, ``Markdown``, ``HTML``, ``clear_output``): Markdown as
    written, DataFrames (and their Styler) as text tables, anything else through ``print``. Figures, which Jupyter
    shows under the cell that drew them, are saved as PNG files in ``<out_dir>/figures/`` and announced by one line
    (``[figure: its titles -> path]``), at ``plt.show()`` or at the end of the cell, then closed, as Jupyter's
    inline backend does. Nothing here imports IPython: a GPU node may not have it, and pandas and matplotlib read
    the real ``IPython`` module whenever one is in ``sys.modules`` (a stand-in under that name breaks them).
    """

    def __init__(self, figures_dir: Path) -> None:
        self.figures_dir = figures_dir
        self.cell = 0
        self.saved: list[Path] = []

    class Markdown:
        def __init__(self, data: str = "", **_: Any) -> None:
            self.data = data

        def __str__(self) -> str:
            return self.data

    class HTML(Markdown):
        def __str__(self) -> str:
            return re.sub(r"<[^<>]+>", "", self.data)

    def display(self, *objs: Any, **_: Any) -> None:
        from matplotlib.figure import Figure

        for obj in objs:
            if isinstance(obj, Figure):
                self.show_figure(obj)
                continue
            inner = getattr(obj, "data", None) if obj.__class__.__name__ == "Styler" else None
            print(inner.to_string() if inner is not None else (obj.to_string() if hasattr(obj, "to_string") else obj))

    @staticmethod
    def clear_output(*_: Any, **__: Any) -> None:
        """Nothing to clear in a log."""

    def show_figure(self, fig: Any) -> None:
        """Save ``fig`` under ``figures_dir``, print one line naming it, close it."""
        import matplotlib.pyplot as plt

        titles = [t for t in [getattr(fig, "_suptitle", None) and fig._suptitle.get_text(),
                              *(ax.get_title() for ax in fig.axes)] if t]
        self.figures_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"cell{self.cell:02d}-"
        path = self.figures_dir / f"{prefix}{sum(p.name.startswith(prefix) for p in self.saved) + 1:02d}.png"
        fig.savefig(path)
        self.saved.append(path)
        print(f"[figure: {' | '.join(titles) or 'untitled'} -> {path}]", flush=True)
        plt.close(fig)

    def show_open_figures(self, *_: Any, **__: Any) -> None:
        """``plt.show()`` in plain mode, and the end of every cell: every open figure, in the order drawn."""
        import matplotlib.pyplot as plt

        for number in plt.get_fignums():
            self.show_figure(plt.figure(number))

    def module(self) -> Any:
        """The stand-in ``IPython.display`` module."""
        import types

        mod = types.ModuleType("IPython.display")
        mod.__doc__ = "dlo's plain-engine stand-in for IPython.display: displays as text, figures as files"
        mod.Markdown, mod.HTML, mod.display, mod.clear_output = (self.Markdown, self.HTML, self.display,
                                                                 self.clear_output)
        return mod


class _Heard:
    """``sys.stdout`` or ``sys.stderr`` of the plain engine in a log: what is written goes through a
    :class:`LineFilter` and tells the watchdog that the cell is not silent. ``flush()`` by the cells' code flushes
    the file, not the line in progress (a bar redrawn with ``\r`` flushes after each redraw)."""

    def __init__(self, target: LineFilter, watchdog: "_Watchdog") -> None:
        self._target, self._watchdog = target, watchdog

    def write(self, text: str) -> int:
        self._watchdog.heard()
        return self._target.write(text)

    def flush(self) -> None:
        self._target.target.flush()

    def end_line(self) -> None:
        self._target.end_line()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False



@contextlib.contextmanager
def _logged_streams() -> Iterator[_Watchdog | None]:
    """In a batch log (stdout not a terminal): stdout and stderr through line filters that feed a watchdog, and
    tqdm bars as text lines, until the block ends; yields the watchdog (None at a terminal: nothing changes)."""
    if _is_terminal(sys.stdout):
        yield None
        return
    streams = (sys.stdout, sys.stderr)
    watchdog = _Watchdog(sys.stdout, 2 * progress.interval_s())
    sys.stdout, sys.stderr = _Heard(LineFilter(streams[0]), watchdog), _Heard(LineFilter(streams[1]), watchdog)
    undo_progress = progress.install()
    try:
        yield watchdog
    finally:
        watchdog.stop()
        undo_progress()
        for wrapped in (sys.stdout, sys.stderr):
            wrapped.end_line()
            wrapped.flush()
        sys.stdout, sys.stderr = streams


@contextlib.contextmanager
def _display_stand_in(shown: _PlainOutput, plt: Any) -> Iterator[Any]:
    """``IPython.display`` and ``plt.show`` replaced by the text stand-ins while the block runs; yields the stand-in
    ``IPython.display`` module."""
    fake = shown.module()
    saved = {"IPython.display": sys.modules.get("IPython.display")}
    # `from IPython.display import display` finds this module in sys.modules without importing IPython itself
    sys.modules["IPython.display"] = fake

    def show(*_: Any, **__: Any) -> None:  # a function, not a bound method: pyplot sets attributes on plt.show
        shown.show_open_figures()

    plt_show, plt.show = plt.show, show
    try:
        yield fake
    finally:
        plt.show = plt_show
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def _in_folder(folder: Path) -> Iterator[None]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def _run_cell(notebook: Path, number: int, cell: dict[str, Any], ns: dict[str, Any], params: dict[str, Any],
              shown: _PlainOutput, fake: Any) -> None:
    """One code cell in ``ns``: its last expression's value displayed as Jupyter does, its open figures saved, the
    parameters injected after the ``parameters`` cell; a failure is one NotebookError line naming the cell."""
    src = _source(cell)
    try:
        tree = ast.parse(src)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, f"{notebook.name}[{number}]", "exec"), ns)  # noqa: S102 - course code
        if last is not None:
            value = eval(compile(ast.Expression(last.value), f"{notebook.name}[{number}]", "eval"), ns)
            if value is not None and not src.rstrip().endswith(";"):
                fake.display(value)
        shown.show_open_figures()
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            ns.update(params)
    except Exception as exc:  # noqa: BLE001 - reported in one line, like run_notebook
        line = str(exc).splitlines()[0] if str(exc) else ""
        raise NotebookError(f"{notebook.name}: code cell {number} ({_first_line(src)}) failed with "
                            f"{type(exc).__name__}: {line}") from exc


def execute_plain(notebook: Path, params: dict[str, Any], out: Path, upto: int | None = None) -> dict[str, Any]:
    """The code cells of ``notebook`` (a checked request: its parameters and output folder) run in this process, in
    the notebook's folder, each announced by a line; returns the final namespace (see
    :func:`dlo.course.runner.run_plain`)."""
    import matplotlib.pyplot as plt

    shown = _PlainOutput(out / "figures")
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    total = len(cells)
    cells = cells[:upto] if upto is not None else cells
    start = time.monotonic()
    with _logged_streams() as watchdog, _display_stand_in(shown, plt) as fake, _in_folder(notebook.parent):
        ns: dict[str, Any] = {"__name__": "__main__", "display": fake.display}
        for number, cell in enumerate(cells, 1):
            shown.cell = number
            if watchdog is not None:
                sys.stderr.end_line()
                sys.stdout.end_line()
            print(_cell_line(number, total, _source(cell), time.monotonic() - start), flush=True)
            if watchdog is not None:
                watchdog.started(number, total)
            _run_cell(notebook, number, cell, ns, params, shown, fake)
    print(f"--- {len(cells)} code cells in {time.monotonic() - start:.1f} s"
          + (f"; {len(shown.saved)} figure(s) in {shown.figures_dir}" if shown.saved else ""), flush=True)
    return ns
