"""Running a notebook: papermill (executed copy in runs/) or plain (its code cells in this Python).

Both print a line as each code cell starts (``--- code cell 3/43 (12.5 s elapsed): first line``) and what the
cell prints, as it comes, so that ``tail -f`` on a batch job's log shows where the notebook is. Lines that
are noise outside a notebook (the profiler's ``USDT:`` traces, the kernel's ``KeyboardInterrupt caught in
kernel``) are left out of that stream, and so are colour codes; the executed notebook keeps every output.

A log must tell a slow job from a hung one, so progress comes out as text (:mod:`dlo.runtime.progress`): tqdm
bars become a line when they start, at most one line per bar every 15 s (``DLO_PROGRESS_INTERVAL``) and their
final state; a bar redrawn with ``\r`` by other code is written at that rate too; and a cell that prints nothing
for 30 s (twice the interval) gets a ``--- code cell N/M still running`` line.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from dlo.course.notebooks import (NotebookArgumentError, NotebookError, _source, check_parameter_types,
                                  parameters_of, resolve_profile)
from dlo.runtime import progress
from dlo.runtime.paths import RUNS_DIR, env_with_dlo, probe_writable

KERNEL_NAME = "dlo"
THIS_PYTHON_KERNEL = "dlo-this-python"  # the stand-in kernel: ipykernel in the Python that runs `dlo run`
# the kernel gets this Python's bin folder first on its PATH, so that `!dlo hint ...` in a notebook finds `dlo`
INSTALL_KERNEL = ('{python} -m ipykernel install --user --name {name} --display-name "Python ({name})" '
                  '--env PATH "{bin}:${{PATH}}"')

# Lines left out of the streamed output (never out of the executed notebook).
NOISE = re.compile(r"^USDT:|KeyboardInterrupt caught in kernel|Kernel is running over TCP without encryption")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # colours, cursor moves, titles


def _prepare(notebook: str | Path, profile: str, parameters: dict[str, Any] | None,
             out_dir: str | Path | None) -> tuple[Path, dict[str, Any], Path]:
    """Validate a run request before anything starts; returns (notebook path, parameters to inject, output
    folder, created if missing). NotebookArgumentError (one line) for a missing notebook, an unknown parameter, a value
    of the wrong type or an output folder that cannot be written."""
    path = Path(notebook).resolve()
    if not path.is_file() or path.suffix != ".ipynb":
        raise NotebookArgumentError(f"no notebook at {path}: give the path of an .ipynb file, e.g. Jour1/jour1.ipynb")
    profile = resolve_profile(profile)
    declared = parameters_of(path)
    params = {"profile": profile, **(parameters or {})}
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise NotebookArgumentError(f"{path.name} has no parameter(s) {', '.join(unknown)}; "
                                    f"its parameters are: {', '.join(declared)}")
    check_parameter_types(path, params)
    out = Path(out_dir).resolve() if out_dir else (RUNS_DIR / path.stem).resolve()
    if out.exists() and not out.is_dir():
        raise NotebookArgumentError(f"output folder {out} is a file: give a folder with --out-dir")
    try:
        probe_writable(out)
    except OSError as exc:
        raise NotebookArgumentError(f"cannot write to the output folder {out}: {exc.strerror or exc}; "
                                    "choose another --out-dir") from None
    if "out_dir" in declared and "out_dir" not in params:
        params["out_dir"] = str(out)
    return path, params, out


def check_request(notebook: str | Path, profile: str = "smoke", parameters: dict[str, Any] | None = None,
                  out_dir: str | Path | None = None, validate: bool = True) -> tuple[Path, dict[str, Any], Path]:
    """What ``dlo run --dry-run`` does: every check of a run (notebook, parameter names and types, output folder,
    created if missing) without starting anything; then, with ``validate``, the notebook's own checks: its code
    cells up to the last one tagged ``validate`` (its set-up, parameters and settings cells, which compute the
    settings and refuse bad values without starting the work), run by the plain engine in another Python
    (:func:`validate_notebook`). Returns (notebook, parameters to inject, output folder); a refused value is a
    :class:`NotebookArgumentError` whose message is the notebook's own line."""
    path, params, out = _prepare(notebook, profile, parameters, out_dir)
    if validate and validation_cells(path):
        validate_notebook(path, params, out)
    return path, params, out


VALIDATE_TAG = "validate"  # the cells that compute and check a notebook's settings: `dlo run --dry-run` runs them


def validation_cells(notebook: str | Path) -> int:
    """How many code cells ``--dry-run`` runs: every one up to the last cell tagged ``validate`` (0: none tagged)."""
    cells = [c for c in json.loads(Path(notebook).read_text())["cells"] if c["cell_type"] == "code"]
    tagged = [i for i, c in enumerate(cells, 1) if VALIDATE_TAG in c.get("metadata", {}).get("tags", [])]
    return max(tagged, default=0)


def validate_notebook(notebook: Path, params: dict[str, Any], out: Path, timeout_s: float = 600) -> str:
    """Run ``notebook``'s validation cells (:func:`validation_cells`) with ``params`` in a fresh Python, their
    output left out; returns the profile they ran with. The full profile, on a machine without a GPU (a login
    node), is checked as its CPU rehearsal ``dry``: the full profile's values and branches, with the GPU counts
    the notebook gives a CPU. NotebookArgumentError with the failing cell's line when they refuse a value."""
    import subprocess

    env = env_with_dlo()
    request = repr({"notebook": str(notebook), "params": params, "out": str(out)})
    try:
        res = subprocess.run([sys.executable, "-c", "from dlo.course.runner import _validate_child; _validate_child()",
                              request], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise NotebookArgumentError(f"{notebook.name}: its checks (--dry-run) did not finish in {timeout_s:.0f} s") \
            from None
    answer = res.stdout.strip().splitlines()[-1:] if res.stdout.strip() else []
    try:
        result = json.loads(answer[0]) if answer else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotebookArgumentError(f"{notebook.name}: its checks (--dry-run) could not run: {last}")
    if result.get("error"):
        note = (" (checked with profile 'dry', the full profile rehearsed on a CPU: this machine has no GPU)"
                if result.get("profile") != params.get("profile") else "")
        raise NotebookArgumentError(result["error"] + note)
    return result["profile"]


def _validate_child() -> None:
    """The other Python of :func:`validate_notebook`: one JSON line on stdout, ``{"profile", "error"}``."""
    import contextlib
    import io

    request = ast.literal_eval(sys.argv[1])
    params = dict(request["params"])
    profile = params.pop("profile")
    if profile == "full":
        import torch

        if not torch.cuda.is_available():
            profile = "dry"
    error = None
    sink = io.StringIO()
    real = sys.stdout
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            run_plain(request["notebook"], profile=profile, parameters=params, out_dir=request["out"],
                      upto=validation_cells(request["notebook"]))
    except NotebookError as exc:
        error = str(exc)
    except SystemExit as exc:  # the kernel guard: no dlo in this Python
        error = f"{Path(request['notebook']).name}: {exc}"
    real.write(json.dumps({"profile": profile, "error": error}) + "\n")
    real.flush()


# --------------------------------------------------------------------------------------------------
# The streamed output
# --------------------------------------------------------------------------------------------------

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

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.silence_s / 4)):
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


# --------------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------------

# Run silently in the kernel before the notebook's cells when the run is logged: with DLO_PROGRESS=text in its
# environment, tqdm.auto's bars become text lines (dlo.runtime.progress); without dlo there, nothing happens
# (the notebook's first cell then says which kernel to pick).
KERNEL_SETUP = ("try:\n"
                "    from dlo.runtime.progress import install_from_env as _dlo_progress\n"
                "    _dlo_progress()\n"
                "    del _dlo_progress\n"
                "except Exception:\n"
                "    pass\n")


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set where they are not set already (the kernel inherits them)."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def registered_kernels() -> set[str]:
    """Names of the Jupyter kernels this Python can start (``jupyter kernelspec list``)."""
    from jupyter_client.kernelspec import KernelSpecManager

    return set(KernelSpecManager().find_kernel_specs())


def choose_kernel(notebook: Path, kernel_name: str | None = None) -> tuple[str, str | None]:
    """(kernel to start, one-line note or None). The kernel asked for (``kernel_name``, else the notebook's own,
    else ``dlo``) when it is registered; else ``THIS_PYTHON_KERNEL``, ipykernel in this very Python, with a
    note saying so and how to register the real one."""
    wanted = kernel_name or json.loads(notebook.read_text()).get("metadata", {}).get("kernelspec", {}).get("name") \
        or KERNEL_NAME
    if wanted in registered_kernels():
        return wanted, None
    import importlib.util

    if importlib.util.find_spec("ipykernel") is None:
        raise NotebookArgumentError(f"no Jupyter kernel named {wanted!r} and no ipykernel in {sys.executable}: "
                                    "pip install ipykernel, or run the code cells without Jupyter: --engine plain")
    register = INSTALL_KERNEL.format(name=wanted, python=sys.executable, bin=Path(sys.executable).parent)
    return THIS_PYTHON_KERNEL, (f"note: no Jupyter kernel named {wanted!r} is registered here: running {notebook.name} "
                                f"with this Python ({sys.executable}); to register it: {register}")


def _this_python_kernel_manager() -> type:
    """A kernel manager class that also knows ``THIS_PYTHON_KERNEL`` (no kernelspec file written anywhere)."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class ThisPythonSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            if kernel_name == THIS_PYTHON_KERNEL:
                return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                  display_name=f"Python ({sys.executable})", language="python", resource_dir="")
            return super().get_kernel_spec(kernel_name)

    class ThisPythonKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _this_python_specs(self) -> KernelSpecManager:
            return ThisPythonSpecs(data_dir=self.data_dir)

    return ThisPythonKernelManager


class _KernelOutput:
    """The kernel process's own stdout/stderr, through a pipe: its last lines (noise left out) are kept for the
    error message when the kernel dies. What its cells print reaches the stream through Jupyter's messages;
    the process's descriptors only echo that, plus the kernel's own log."""

    def __init__(self, keep: int = 30) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with os.fdopen(self.read_fd, "r", errors="replace") as pipe:
            for line in pipe:
                if line.strip() and not NOISE.search(line):
                    self.lines.append(line.rstrip())

    def close(self) -> None:
        os.close(self.write_fd)
        self._thread.join(timeout=5)


def _engine(stream: _Stream | None, kernel_io: _KernelOutput, kernel_manager_class: type | None) -> str:
    """Register (once per call: the arguments differ) and return the name of dlo's papermill engine: papermill's
    nbclient engine, plus the progress lines and filtered outputs of ``stream`` and the kernel's own output
    sent to ``kernel_io``."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger
    from papermill.utils import merge_kwargs, remove_args
    from nbclient.util import run_sync

    class Client(PapermillNotebookClient):
        def log_output_message(self, output: Any) -> None:
            if stream is not None:
                stream.output(output)

        async def async_start_new_kernel_client(self) -> Any:
            kc = await super().async_start_new_kernel_client()
            if stream is not None:  # text progress bars, before the first cell imports tqdm (silent: no output)
                await self.async_wait_for_reply(kc.execute(KERNEL_SETUP, silent=True, store_history=False))
            return kc

        start_new_kernel_client = run_sync(async_start_new_kernel_client)  # what papermill's setup_kernel calls

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, log_output: bool = False,
                                     stdout_file: Any = None, stderr_file: Any = None, start_timeout: int = 60,
                                     execution_timeout: float | None = None, **kwargs: Any) -> Any:
            if stream is not None:
                stream.begin(nb_man.nb.cells)
                started = nb_man.cell_start

                def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                    stream.cell_start(cell, cell_index)
                    return started(cell, cell_index, **kw)

                nb_man.cell_start = cell_start
            kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
            extra = {"kernel_manager_class": kernel_manager_class} if kernel_manager_class else {}
            client = Client(nb_man, **merge_kwargs(kwargs, timeout=execution_timeout, startup_timeout=start_timeout,
                                                   kernel_name=kernel_name, log=logger, log_output=False,
                                                   stdout_file=stream, **extra))
            return client.execute(stdout=kernel_io.write_fd, stderr=kernel_io.write_fd)

    papermill_engines.register("dlo", Engine)
    return "dlo"


class _UnknownParameterFilter:
    """Drops papermill's 'Passed unknown parameter' warning: its parser reads ``name: int = 0`` but not
    ``name: int | None = None``, and ``_prepare`` has already checked every name and type."""

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith("Passed unknown parameter")


def run_notebook(notebook: str | Path, profile: str = "smoke", parameters: dict[str, Any] | None = None,
                 out_dir: str | Path | None = None, kernel_name: str | None = None,
                 log_output: bool = True, timeout_s: float | None = None,
                 stdout: TextIO | None = None, stderr: TextIO | None = None) -> Path:
    """Execute ``notebook`` with papermill into ``runs/<stem>/<stem>.ipynb`` and return that path.

    The notebook runs in its own folder (as in JupyterLab), gets ``profile`` (and ``out_dir`` when it
    declares that parameter) injected, and any failing cell raises :class:`NotebookError` naming it.
    ``log_output``: print a line as each code cell starts and the cells' output as it comes, to ``stdout`` and
    ``stderr`` (default: this process's). The kernel is ``kernel_name``, else the notebook's (``dlo``); when
    that one is not registered, ipykernel in this Python, with a one-line note on ``stderr``.
    """
    import logging

    import papermill as pm

    notebook, params, out = _prepare(notebook, profile, parameters, out_dir)
    pm_log = logging.getLogger("papermill")
    if not any(isinstance(f, _UnknownParameterFilter) for f in pm_log.filters):
        pm_log.addFilter(_UnknownParameterFilter())
    out_stream, err_stream = stdout or sys.stdout, stderr or sys.stderr
    kernel, note = choose_kernel(notebook, kernel_name)
    if note:
        print(note, file=err_stream, flush=True)
    executed = out / notebook.name
    stream = _Stream(out_stream, err_stream) if log_output else None
    kernel_io = _KernelOutput()
    manager = _this_python_kernel_manager() if kernel == THIS_PYTHON_KERNEL else None
    text = {progress.ENV: "text"} if log_output else {}
    try:
        with _environ(**text):
            pm.execute_notebook(str(notebook), str(executed), parameters=params, kernel_name=kernel,
                                engine_name=_engine(stream, kernel_io, manager), cwd=str(notebook.parent),
                                progress_bar=False, execution_timeout=timeout_s)
    except pm.PapermillExecutionError as exc:
        where = _describe_failed_cell(notebook, executed)
        evalue = str(exc.evalue).splitlines()[0] if exc.evalue else ""
        raise NotebookError(f"{notebook.name}: {where} failed with {exc.ename}: {evalue} "
                            f"-- executed copy: {executed}") from None
    except Exception as exc:  # noqa: BLE001 - the kernel died, did not start or timed out: one line
        if stream is not None:
            stream.flush()
        if kernel_io.lines:  # the kernel process's last words, for a kernel that died
            print("\n".join(kernel_io.lines), file=err_stream, flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotebookError(f"{notebook.name}: the run stopped with the kernel {kernel!r} "
                            f"({type(exc).__name__}: {first}) -- executed copy: {executed}") from None
    finally:
        kernel_io.close()
        if stream is not None:
            stream.close()
            stream.flush()
    if stream is not None:
        stream.done()
    return executed


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


def run_plain(notebook: str | Path, profile: str = "smoke", parameters: dict[str, Any] | None = None,
              out_dir: str | Path | None = None, upto: int | None = None) -> dict[str, Any]:
    """Execute a notebook's code cells in order in this process, without Jupyter (no kernel, no papermill).

    For machines that have torch but no Jupyter stack (a GPU node's bare Python): the code that runs is
    the notebook's own. Parameters are injected after the ``parameters`` cell, as papermill does; the
    value of a cell's last expression is shown, as Jupyter shows it, and every display comes out as text
    (:class:`_PlainOutput`; figures as PNG files in ``<out_dir>/figures/``). The cells run in the notebook's
    folder, as in Jupyter (relative paths such as a sibling script resolve the same way). Returns the
    final namespace. ``upto``: run only the first ``upto`` code cells.

    When this process's stdout is not a terminal (a batch log), what the cells print goes through
    :class:`LineFilter` (no colour codes, ``\r`` redraws at a bounded rate), tqdm bars are text lines
    (:mod:`dlo.runtime.progress`), and a cell silent for 30 s gets a ``still running`` line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    notebook, params, out = _prepare(notebook, profile, parameters, out_dir)
    shown = _PlainOutput(out / "figures")
    fake = shown.module()
    saved = {"IPython.display": sys.modules.get("IPython.display")}
    # `from IPython.display import display` finds this module in sys.modules without importing IPython itself
    sys.modules["IPython.display"] = fake

    def show(*_: Any, **__: Any) -> None:  # a function, not a bound method: pyplot sets attributes on plt.show
        shown.show_open_figures()

    plt_show, plt.show = plt.show, show
    ns: dict[str, Any] = {"__name__": "__main__", "display": fake.display}
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    total = len(cells)
    cells = cells[:upto] if upto is not None else cells
    cwd = os.getcwd()
    logged = not _is_terminal(sys.stdout)
    watchdog, streams, undo_progress = None, (sys.stdout, sys.stderr), None
    if logged:
        watchdog = _Watchdog(sys.stdout, 2 * progress.interval_s())
        sys.stdout, sys.stderr = _Heard(LineFilter(streams[0]), watchdog), _Heard(LineFilter(streams[1]), watchdog)
        undo_progress = progress.install()
    os.chdir(notebook.parent)
    start = time.monotonic()
    try:
        for number, cell in enumerate(cells, 1):
            src = _source(cell)
            first = _first_line(src)
            shown.cell = number
            if logged:
                sys.stderr.end_line()
                sys.stdout.end_line()
            print(_cell_line(number, total, src, time.monotonic() - start), flush=True)
            if watchdog is not None:
                watchdog.started(number, total)
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
                raise NotebookError(f"{notebook.name}: code cell {number} ({first}) failed with "
                                    f"{type(exc).__name__}: {line}") from exc
    finally:
        os.chdir(cwd)
        plt.show = plt_show
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        if logged:
            watchdog.stop()
            undo_progress()
            for wrapped in (sys.stdout, sys.stderr):
                wrapped.end_line()
                wrapped.flush()
            sys.stdout, sys.stderr = streams
    print(f"--- {len(cells)} code cells in {time.monotonic() - start:.1f} s"
          + (f"; {len(shown.saved)} figure(s) in {shown.figures_dir}" if shown.saved else ""), flush=True)
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
