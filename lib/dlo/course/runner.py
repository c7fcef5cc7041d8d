"""Running a notebook: papermill (executed copy in runs/) or plain (its code cells in this Python).

Both print a line as each code cell starts (``--- code cell 3/43 (12.5 s elapsed): first line``) and what the
cell prints, as it comes, so that ``tail -f`` on a batch job's log shows where the notebook is. Lines that
are noise outside a notebook (the profiler's ``USDT:`` traces, the kernel's ``KeyboardInterrupt caught in
kernel``) are left out of that stream, and so are colour codes; the executed notebook keeps every output.

A log must tell a slow job from a hung one, so progress comes out as text (:mod:`dlo.runtime.progress`): tqdm
bars become a line when they start, at most one line per bar every 15 s (``DLO_PROGRESS_INTERVAL``) and their
final state; a bar redrawn with ``\r`` by other code is written at that rate too; and a cell that prints nothing
for 30 s (twice the interval) gets a ``--- code cell N/M still running`` line.

The streamed output is written by :mod:`dlo.course.notebook_stream`; the plain engine runs the cells in
:mod:`dlo.course.plain_engine`.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from dlo.course.notebooks import (NotebookArgumentError, NotebookError, _source, check_parameter_types,
                                  parameters_of, resolve_profile)
from dlo.course.notebook_stream import NOISE, LineFilter, _Stream
from dlo.course.plain_engine import execute_plain
from dlo.runtime import progress
from dlo.runtime.paths import RUNS_DIR, env_with_dlo, probe_writable

KERNEL_NAME = "dlo"
THIS_PYTHON_KERNEL = "dlo-this-python"  # the stand-in kernel: ipykernel in the Python that runs `dlo run`
# the kernel gets this Python's bin folder first on its PATH, so that `!dlo hint ...` in a notebook finds `dlo`
INSTALL_KERNEL = ('{python} -m ipykernel install --user --name {name} --display-name "Python ({name})" '
                  '--env PATH "{bin}:${{PATH}}"')


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
    notebook, params, out = _prepare(notebook, profile, parameters, out_dir)
    return execute_plain(notebook, params, out, upto)


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
