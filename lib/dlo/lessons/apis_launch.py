"""Launching Accelerate from a notebook (part of :mod:`dlo.lessons.apis`): ``accelerate launch`` with a YAML
config, its output streamed into the cell, and a failure or a hang turned into one line that says where.
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from dlo.lessons.apis_core import missing_library
from dlo.runtime.paths import run_dir
from dlo.runtime.records import RECORDS_ENV, read_records


_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit)\b:?.*)$")
_LAUNCHER_ERRORS = ("ChildFailedError", "CalledProcessError")


def _last_error_line(lines: Sequence[str]) -> str:
    """The first exception line a worker printed (``ValueError: ...``), not the launcher's own ones
    (``ChildFailedError``, which only says that a worker failed); else the last non-blank line."""
    for line in lines:
        m = _EXCEPTION_LINE.match(line.strip())
        if m and not any(name in line for name in _LAUNCHER_ERRORS):
            return m.group(1).strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "(no output)")


def _stop_with_stacks(pid: int, wait_s: float = 30.0) -> None:
    """Stop a hung launch so that its log says where it hung: every process under ``pid`` gets SIGABRT, on
    which Python (started with ``PYTHONFAULTHANDLER=1``) prints each thread's stack before it dies; then
    whatever is left is killed. ``wait_s`` is a ceiling for a loaded machine, where printing the stacks takes seconds:
    the wait ends as soon as every process has died."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in reversed(procs):  # the ranks (started last) first, so that the launcher does not stop them itself
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGABRT)
    psutil.wait_procs(procs, timeout=wait_s)
    _kill_tree(pid)


def _kill_tree(pid: int) -> None:
    """Kill a process and everything it started (torchrun's workers run in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def launch_accelerate(script: str | os.PathLike, args: Sequence[str], config_file: str | os.PathLike, *,
                      records_dir: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
                      timeout_s: float = 600, echo: bool = True) -> list[dict]:
    """``accelerate launch --config_file <config_file> <script> <args>``; returns the records the ranks wrote
    (``dlo.runtime.write_record``), like :func:`dlo.runtime.launch`. A failure raises ``RuntimeError`` with
    the error line of the first rank that said one (the whole log is in ``<records_dir>/launch.log``)."""
    reason = missing_library("accelerate")
    if reason:
        raise ModuleNotFoundError(reason)
    script = Path(script).resolve()
    if not script.is_file():
        raise ValueError(f"script {script} does not exist")
    folder = Path(records_dir) if records_dir is not None else Path(
        tempfile.mkdtemp(prefix=f"{script.stem}-accelerate-{time.strftime('%Y%m%d-%H%M%S')}-", dir=run_dir("launch")))
    folder.mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    child_env.update(env or {})
    child_env[RECORDS_ENV] = str(folder)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["PYTHONFAULTHANDLER"] = "1"  # a launch stopped at its timeout prints where each process was
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
               str(script), *[str(a) for a in args]]
    lines: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=child_env, text=True, encoding="utf-8", errors="replace", bufsize=1,
                            start_new_session=True)
    pending: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            pending.put(line)
        pending.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline, timed_out = time.monotonic() + timeout_s, False
    try:
        while True:  # lines are printed here, in the caller's thread (the right Jupyter cell)
            if time.monotonic() > deadline and proc.poll() is None:
                timed_out = True
                _stop_with_stacks(proc.pid)
            try:
                line = pending.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            lines.append(line.rstrip("\n"))
            if echo and not _noise(line):
                print("[accelerate] " + line.rstrip("\n"), flush=True)
        code = proc.wait()
    except BaseException:  # the notebook's stop button included: leave no worker behind
        _kill_tree(proc.pid)
        raise
    finally:
        (folder / "launch.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if timed_out:
        raise RuntimeError(f"accelerate launch of {script.name} timed out after {timeout_s:g} s; where each "
                           f"process was is in its log: {folder / 'launch.log'}")
    if code != 0:
        raise RuntimeError(f"accelerate launch of {script.name} failed (exit code {code}): {_last_error_line(lines)} "
                           f"(log: {folder / 'launch.log'})")
    return read_records(folder)


def _noise(line: str) -> bool:
    """torchrun's banner about OMP_NUM_THREADS and the like: not worth a line in the notebook."""
    return "torch/distributed/run.py" in line or line.strip() in ("", "*****************************************")
