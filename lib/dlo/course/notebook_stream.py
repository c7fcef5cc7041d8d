"""The streamed output of a notebook run: each code cell announced as it starts, what it prints passed on line
by line without the noise and colour codes of a terminal (:class:`LineFilter`), and a ``still running`` line for a
cell that stays silent (a log must tell a slow job from a hung one)."""
from __future__ import annotations

import re
import threading
import time
from typing import Any, TextIO

from dlo.course.notebooks import _source
from dlo.runtime import progress

# Lines left out of the streamed output (never out of the executed notebook).
NOISE = re.compile(r"^USDT:|KeyboardInterrupt caught in kernel|Kernel is running over TCP without encryption")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # colours, cursor moves, titles


class LineFilter:
    """A write-only text stream that passes whole lines on to ``target``, leaving out the lines that match
    ``NOISE`` and every colour code. A line ended by ``\r`` (a progress bar redrawn in place) is written as a
    line of its own, at most one every ``every_s`` seconds (default :func:`dlo.runtime.progress.interval_s`);
    the redraws in between are dropped. ``clock``: replaces ``time.monotonic`` (tests)."""

    def __init__(self, target: TextIO, every_s: float | None = None, clock: Any = time.monotonic) -> None:
        self.target = target
        self.every_s = progress.interval_s() if every_s is None else every_s
        self.clock = clock
        self._partial = ""
        self._redrawn_at: float | None = None
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            pieces = re.split(r"(?<=[\r\n])", (self._partial + text).replace("\r\n", "\n"))
            self._partial = pieces.pop()  # "" when the text ended a line
            self._emit(pieces)
        return len(text)

    def _emit(self, lines: list[str]) -> None:
        kept = []
        for line in lines:
            line = _ANSI.sub("", line)
            if not line or NOISE.search(line):
                continue
            if line.endswith("\r"):  # a redraw: its text, as a line, at a bounded rate
                line = line.strip()
                now = self.clock()
                if not line or (self._redrawn_at is not None and now - self._redrawn_at < self.every_s):
                    continue
                self._redrawn_at, line = now, line + "\n"
            kept.append(line)
        if kept:
            self.target.write("".join(kept))
            self.target.flush()

    def flush(self) -> None:
        with self._lock:
            partial, self._partial = self._partial, ""
            self._emit([partial])
        self.target.flush()

    def end_line(self) -> None:
        """End the line in progress, if any (at a cell's end: the next line starts on a line of its own)."""
        with self._lock:
            partial, self._partial = self._partial, ""
            if partial.strip():
                self._emit([partial + "\n"])

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        """What code reads of a stream besides writing to it (``encoding``, ``errors``, ``fileno()``; Ray reads
        ``sys.stdout.encoding``): the target's."""
        if name == "target":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.target, name)


class _Watchdog:
    """A daemon thread that writes ``--- code cell N/M still running ...`` to ``out`` when the running cell has
    printed nothing for ``silence_s`` seconds (again every ``silence_s`` while it stays silent)."""

    def __init__(self, out: TextIO, silence_s: float) -> None:
        self.out, self.silence_s = out, silence_s
        self.cell: tuple[int, int, float] | None = None  # (number, total, when it started)
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if silence_s > 0:
            self._thread.start()

    def started(self, number: int, total: int) -> None:
        with self._lock:
            self.cell, self.last = (number, total, time.monotonic()), time.monotonic()

    def heard(self) -> None:
        self.last = time.monotonic()

    def _due_in(self) -> float:
        """Seconds to wait before looking again: until the silence reaches ``silence_s`` (so the line comes then,
        not up to a second later: a log is never silent for longer), at most a second (a cell that printed since
        moves the deadline)."""
        poll = min(1.0, self.silence_s / 4)
        if self.cell is None:  # no cell running: nothing is due
            return poll
        return max(0.01, min(poll, self.last + self.silence_s - time.monotonic()))

    def _run(self) -> None:
        while not self._stop.wait(self._due_in()):
            with self._lock:
                now = time.monotonic()
                if self.cell is None or now - self.last < self.silence_s:
                    continue
                number, total, since = self.cell
                self.last = now
            try:
                self.out.write(f"--- code cell {number}/{total} still running ({now - since:.0f} s in this cell, "
                               f"nothing printed for {self.silence_s:.0f} s)\n")
                self.out.flush()
            except (ValueError, OSError):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def _first_line(src: str) -> str:
    return next((ln.strip() for ln in src.splitlines() if ln.strip()), "empty cell")[:60]


def _cell_line(number: int, total: int, src: str, elapsed_s: float) -> str:
    return f"--- code cell {number}/{total} ({elapsed_s:.1f} s elapsed): {_first_line(src)}"


def _rich_text(output: dict[str, Any]) -> str | None:
    """What a display or a cell's value shows in a text log: Markdown as written, a table or value as its text;
    nothing for figures, widgets (tqdm bars) and bare ``<object at 0x...>`` representations."""
    data = output.get("data", {})
    if any(key.startswith("image/") or "widget" in key for key in data):
        return None
    text = data.get("text/markdown") or data.get("text/plain")
    if text is None:
        return None
    text = "".join(text) if isinstance(text, list) else text
    if re.fullmatch(r"<[^<>]* at 0x[0-9a-f]+>", text.strip()):
        return None
    return text if text.endswith("\n") else text + "\n"


class _Stream:
    """Where papermill's client sends each output as it arrives, and the cell-by-cell progress lines."""

    def __init__(self, out: TextIO, err: TextIO, silence_s: float | None = None) -> None:
        self.out, self.err = LineFilter(out), LineFilter(err)
        self.numbers: dict[int, int] = {}  # cell index in the executed notebook -> number among the source's code cells
        self.start = time.monotonic()
        self.silence_s = 2 * progress.interval_s() if silence_s is None else silence_s
        self.watchdog: _Watchdog | None = None

    def begin(self, cells: list[Any]) -> None:
        """Number the code cells as the source notebook does (papermill's injected parameters cell is not one)."""
        code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
                and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
        self.numbers = {index: number for number, index in enumerate(code, 1)}
        self.start = time.monotonic()
        if self.watchdog is None:
            self.watchdog = _Watchdog(self.out, self.silence_s)

    def cell_start(self, cell: dict[str, Any], index: int | None) -> None:
        if index in self.numbers:
            self.err.end_line()
            self.out.end_line()
            self.out.write(_cell_line(self.numbers[index], len(self.numbers), _source(cell),
                                      time.monotonic() - self.start) + "\n")
            if self.watchdog is not None:
                self.watchdog.started(self.numbers[index], len(self.numbers))

    def output(self, output: dict[str, Any]) -> None:
        if self.watchdog is not None:
            self.watchdog.heard()
        kind = output.get("output_type")
        if kind == "stream":
            text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
            (self.err if output.get("name") == "stderr" else self.out).write(text)
        elif kind in ("execute_result", "display_data"):
            text = _rich_text(output)
            if text:
                self.out.write(text)
        elif kind == "error":
            self.out.flush()
            self.err.write(_ANSI.sub("", "\n".join(output.get("traceback", []))) + "\n")

    def flush(self) -> None:
        self.out.flush()
        self.err.flush()

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    def done(self) -> None:
        self.out.write(f"--- {len(self.numbers)} code cells in {time.monotonic() - self.start:.1f} s\n")

