"""Progress in a batch log: tqdm bars as text lines at a bounded rate, and a heartbeat for long loops.

In JupyterLab ``tqdm.auto`` draws a widget; in a terminal, a bar redrawn in place with ``\\r``. Neither reaches a
batch job's log usefully: the widget is not text at all, and a bar redrawn ten times a second is either swallowed
or floods the file. ``dlo run`` therefore turns on *text progress* where the notebook runs (``DLO_PROGRESS=text``
in the kernel's environment, or :func:`text_progress` around the plain engine): :func:`install` replaces
``tqdm.auto.tqdm`` (and ``trange``) by :class:`TextBar`, which writes one plain line (no colour, no cursor moves)
when a bar starts, at most one line per bar every :func:`interval_s` seconds while it runs, and its final state
when it closes. Every ``from tqdm.auto import tqdm`` made after that gets it: the notebooks' own bars and those
of ``dlo``'s helpers alike.

:class:`Heartbeat` is for loops without a bar (a training run with ``progress=False``): one line at most every
``interval_s`` seconds, so that a job that is slow can be told from one that hangs.

``DLO_PROGRESS_INTERVAL`` (seconds, default 15) sets the rate.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, TextIO

ENV = "DLO_PROGRESS"
INTERVAL_ENV = "DLO_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 15.0

_installed: dict[str, Any] = {}  # module attribute -> the object it replaced, while text progress is on


def interval_s() -> float:
    """Seconds between two lines of one bar (``$DLO_PROGRESS_INTERVAL``, default 15; at least 0)."""
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


def text_mode() -> bool:
    """Whether progress goes to a log as text lines (:func:`install` was called here, or ``DLO_PROGRESS=text``)."""
    return bool(_installed) or os.environ.get(ENV, "").strip().lower() == "text"


def _text_bar_class() -> type:
    from tqdm.asyncio import tqdm_asyncio  # what tqdm.auto's class derives from, minus the notebook widget

    class _Sink:
        """Where tqdm's own writes go (its ``\\r`` redraws and cursor moves): nowhere."""

        def write(self, _: str) -> None:
            pass

        def flush(self) -> None:
            pass

    class TextBar(tqdm_asyncio):
        """A tqdm bar for logs: a plain line at the start, at most one per ``interval_s`` seconds, the final state
        at the end (``leave=False`` or not); ASCII only, no ``\\r``, no escape sequences."""

        monitor_interval = 0  # no monitor thread: a line printed from another thread may land in another cell

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            out = kwargs.pop("file", None)
            self._out: TextIO = out if out is not None and out is not sys.stderr else sys.stdout
            self._every = interval_s()
            self._last_line: str | None = None
            self._printed_at: float | None = None
            self._closing = self._final_written = False
            kwargs.update(file=_Sink(), ascii=True, dynamic_ncols=False, position=None)
            kwargs["ncols"] = kwargs.get("ncols") or 100
            kwargs["mininterval"] = max(float(kwargs.get("mininterval", 0.1)), self._every)
            kwargs["maxinterval"] = max(float(kwargs.get("maxinterval", 10.0)), kwargs["mininterval"])
            kwargs.pop("colour", None)
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg == "" or self._final_written:  # tqdm clearing its line, or redrawing after close() wrote it
                return True
            now = time.monotonic()
            if not self._closing and self._printed_at is not None and now - self._printed_at < self._every:
                return True
            line = (self.__str__() if msg is None else msg).strip()
            if line and line != self._last_line:
                try:
                    self._out.write(line + "\n")
                    self._out.flush()
                except (ValueError, OSError):  # the stream is closed: progress is not worth an error
                    pass
                self._last_line, self._printed_at = line, now
            return True

        def clear(self, *_: Any, **__: Any) -> None:
            pass

        def moveto(self, *_: Any, **__: Any) -> None:
            pass

        def close(self) -> None:
            if not self.disable and not self._closing and getattr(self, "last_print_t", None) is not None:
                self._closing = True
                self.display()  # the final state, once
            self._closing = self._final_written = True
            super().close()

    # importable by name (module __getattr__ below): pickle and Ray's cloudpickle then refer to the class instead of
    # copying it by value with tqdm's class-level multiprocessing lock, which cannot be pickled (a Ray trainable that
    # uses a bar would fail with "RLock objects should only be shared between processes through inheritance")
    TextBar.__module__, TextBar.__qualname__ = __name__, "TextBar"
    return TextBar


_TEXT_BAR: type | None = None


def text_bar_class() -> type:
    """The :class:`TextBar` class (tqdm is imported on first use)."""
    global _TEXT_BAR
    if _TEXT_BAR is None:
        _TEXT_BAR = _text_bar_class()
    return _TEXT_BAR


def __getattr__(name: str) -> Any:
    """``dlo.runtime.progress.TextBar``: the class, built on first use (PEP 562)."""
    if name == "TextBar":
        return text_bar_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install() -> Callable[[], None]:
    """Make ``tqdm.auto.tqdm`` / ``trange`` (and ``tqdm.autonotebook``'s) the text bar; returns the undo function."""
    import tqdm.auto
    import tqdm.autonotebook

    bar = text_bar_class()

    def trange(*args: Any, **kwargs: Any) -> Any:
        return bar(range(*args), **kwargs)

    before = dict(_installed)
    for module in (tqdm.auto, tqdm.autonotebook):
        for name, value in (("tqdm", bar), ("trange", trange)):
            key = f"{module.__name__}.{name}"
            _installed.setdefault(key, getattr(module, name))
            setattr(module, name, value)

    def undo() -> None:
        for key in list(_installed):
            if key in before:
                continue
            module_name, name = key.rsplit(".", 1)
            setattr(sys.modules[module_name], name, _installed.pop(key))

    return undo


def install_from_env() -> bool:
    """:func:`install` when ``DLO_PROGRESS=text``; whether it did (``dlo run`` calls it in the kernel first)."""
    if os.environ.get(ENV, "").strip().lower() != "text":
        return False
    install()
    return True


class text_progress:
    """``with text_progress():`` -- text bars (:func:`install`) inside, the previous ``tqdm.auto`` after."""

    def __enter__(self) -> "text_progress":
        self._undo = install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._undo()


class Heartbeat:
    """One line at most every ``every_s`` seconds (default :func:`interval_s`, at least 1 s apart only if asked),
    for a loop that has no bar: ``hb = Heartbeat(); ...; hb.beat(lambda: f"step {step}/{total}")``. The message is
    built only when a line is due. ``clock`` replaces ``time.monotonic`` (tests)."""

    def __init__(self, every_s: float | None = None, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = interval_s() * 2 if every_s is None else every_s
        self.out = out
        self.clock = clock
        self.last = clock()
        self.lines = 0

    def beat(self, message: Callable[[], str]) -> bool:
        """Print ``message()`` if ``every_s`` seconds have passed since the last line (or the start)."""
        now = self.clock()
        if now - self.last < self.every_s:
            return False
        self.last = now
        self.lines += 1
        print(message(), file=self.out if self.out is not None else sys.stdout, flush=True)
        return True
