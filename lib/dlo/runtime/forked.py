"""The fork launcher: many short runs of a script that imports torch (checkers, tests, rehearsals).

Each rank is forked from a server process that has already imported torch (``multiprocessing``'s
``forkserver``), instead of being a fresh Python that spends seconds importing it. The ranks meet on a store
that the launching process hosts on 127.0.0.1 (:mod:`dlo.runtime.loopback`), so nothing listens beyond the
loopback interface.
"""
from __future__ import annotations

import codecs
import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Iterator

from dlo.runtime.launch_report import (LaunchError, _code_text, _first_failure, _fresh_notes, _last_meaningful,
                                       _read_lines, _without_own_prefix)
from dlo.runtime.launch_request import _can_fork_server, _check_request, _child_env, _records_folder, _usable_cpus
from dlo.runtime.loopback import LOOPBACK, loopback_network, loopback_store
from dlo.runtime.records import read_records

#: A rank that fails leaves this long for the others to finish writing (records, failure notes) before
#: they are stopped: a peer blocked in a collective with the failed rank would otherwise wait for its timeout.
FORKED_GRACE_S = 3.0


def _abort_with_stacks(procs: Sequence[Any], wait_s: float = 5.0) -> None:
    """SIGABRT to forked ranks: each prints its threads' stacks into its log (``faulthandler``) and dies."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGABRT)
    deadline = time.monotonic() + wait_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))


def _forked_rank(script: str, args: list[str], env: dict[str, str], log_path: str) -> None:
    """One rank, in a process forked from the server: run ``script`` as ``python script args`` would."""
    import runpy
    import traceback

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    import faulthandler

    faulthandler.enable(file=sys.stderr)  # SIGABRT at a timeout (launch_forked) prints where each thread was
    os.environ.clear()
    os.environ.update(env)
    if "torch" in sys.modules:  # imported by the server before OMP_NUM_THREADS was this rank's
        sys.modules["torch"].set_num_threads(max(1, int(env.get("OMP_NUM_THREADS", "1") or 1)))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    except BaseException:  # noqa: BLE001 - reported as `python script` would, then a failing exit code
        try:
            sys.excepthook(*sys.exc_info())  # dlo's hook notes the time for the blame, then prints the traceback
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)  # no atexit handlers inherited from the server


#: What the fork server imports once for all the ranks it forks. torch.optim's optimizers import torch._dynamo
#: (sympy included) when the first one is built: about 1.7 s of CPU in every rank, 13 s for 8 ranks on 2 cores.
FORK_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")


def run_forked(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    nproc: int = 2,
    *,
    records_dir: str | os.PathLike | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout_s: float | None = None,
    preload: Sequence[str] = FORK_PRELOAD,
    echo: bool = False,
) -> list[dict]:
    """Run ``script`` on ``nproc`` local processes like :func:`launch` does with torchrun, but start each
    rank by forking a server process that has already imported ``preload``, and return their records.

    Why: a rank that starts Python and imports torch spends seconds before its first line of work, and
    torchrun itself is one more such process. A checker or a test that runs a script on 2-4 processes
    dozens of times pays that start-up every time; forked ranks pay it once (``multiprocessing``'s
    ``forkserver``: the server never runs a torch operation, so no thread pool is copied into a fork).

    Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` =
    127.0.0.1 and the ``MASTER_PORT`` of a store this process hosts on 127.0.0.1 (the ranks join it as
    clients, as torchrun's ranks join their agent's: ``TORCHELASTIC_USE_AGENT_STORE``), gloo and NCCL on the
    loopback interface, the caller's environment (without its rank variables) plus ``env``, and runs
    ``script`` as ``__main__`` with ``sys.argv = [script, *args]``. Its records and its output
    (``rank<r>.log``) go to ``records_dir`` (as for :func:`launch`). A failure raises :class:`LaunchError`
    like :func:`launch` (the rank that failed first and its last meaningful line); once one rank fails, the
    others get :data:`FORKED_GRACE_S` seconds to finish, then are killed. Local only: use :func:`launch` for
    torchrun's elastic agent or for srun under Slurm. ``echo=True`` prints the ranks' lines as they are
    written, prefixed ``[rank<r>]`` as :func:`launch` does (:func:`launch` calls this under ``DLO_LAUNCHER=fork``).
    """
    script_path, args, nproc = _check_request(script, args, nproc, timeout_s)
    if not _can_fork_server():  # Windows: dlo.runtime.launch.launch_forked runs torchrun instead
        raise RuntimeError("this platform has no fork server: use dlo.runtime.launch(), which runs torchrun")

    folder = _records_folder(script_path, records_dir)
    logs = [folder / f"rank{rank}.log" for rank in range(nproc)]
    started = time.time()
    store = loopback_store(timeout_s=timeout_s or 300)  # the ranks meet here, on 127.0.0.1 only
    try:
        base_env = _rank_env(env, folder, nproc, store.port)
        procs = _fork_ranks(script_path, args, base_env, logs, preload)
        outcome = _watch(procs, logs, timeout_s, echo)
    finally:
        del store
    per_rank = {rank: [_without_own_prefix(line, rank) for line in _read_lines(path)] for rank, path in enumerate(logs)}
    log = "\n".join(f"[rank{rank}] {line}" for rank, lines in per_rank.items() for line in lines)
    (folder / "launch.log").write_text(log + "\n", encoding="utf-8")
    if not outcome.timed_out and all(c == 0 for c in outcome.codes.values()):
        return read_records(folder)
    raise _failure(outcome, per_rank, _fresh_notes(folder, started), script_path, args, timeout_s, folder, log)


def _rank_env(env: Mapping[str, str | None] | None, folder: Path, nproc: int, port: int) -> dict[str, str]:
    """What every forked rank's environment holds (each adds its own ``RANK`` and ``LOCAL_RANK``)."""
    base_env = _child_env(env, folder)
    base_env.setdefault("OMP_NUM_THREADS", str(max(1, _usable_cpus() // nproc)))
    loopback_network(base_env)
    base_env.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                    GROUP_RANK="0", TORCHELASTIC_USE_AGENT_STORE="True")
    return base_env


def _fork_ranks(script_path: Path, args: list[str], base_env: dict[str, str], logs: Sequence[Path],
                preload: Sequence[str]) -> list[Any]:
    """One process per rank, forked from the server (not started yet)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))  # applies when the server starts (the first launch)
    return [ctx.Process(target=_forked_rank, name=f"{script_path.stem}-rank{rank}",
                        args=(str(script_path), args, {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              str(log)))
            for rank, log in enumerate(logs)]


@dataclasses.dataclass
class _Outcome:
    """How the ranks of a forked run ended: ``codes`` (None: never started), the ranks the launcher ``stopped``
    itself, when each was seen to exit (``exited_at``, time.time()), and for a timeout each log's lines before
    the ranks printed their stacks (``before``)."""

    codes: dict[int, int | None]
    stopped: set[int]
    exited_at: dict[int, float]
    timed_out: bool = False
    before: dict[int, list[str]] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def _caller_not_rerun() -> Iterator[None]:
    """While the ranks are started: multiprocessing would run the caller's script (``__main__``) again in each of
    them before its target, so a script without an ``if __name__ == "__main__":`` guard (a student's file calling
    ``check(...)``) would start its launch again from every rank. The ranks run only the worker script, so the
    caller's main module is hidden from multiprocessing's preparation data, and restored after."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__.pop(k) for k in ("__file__",) if k in main.__dict__}
    spec = getattr(main, "__spec__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
        main.__spec__ = spec


def _watch(procs: Sequence[Any], logs: Sequence[Path], timeout_s: float | None, echo: bool) -> _Outcome:
    """Start the ranks and wait for them: every one ends, or one fails (the others then get
    :data:`FORKED_GRACE_S` seconds), or ``timeout_s`` passes. Whatever happens, no rank is left running."""
    from multiprocessing.connection import wait as wait_for

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first_failure_at, outcome = None, _Outcome({}, set(), {})
    tails = [_Tail(path, rank) for rank, path in enumerate(logs)] if echo else []
    try:
        with _caller_not_rerun():
            for proc in procs:
                proc.start()
        while any(p.exitcode is None for p in procs):
            wait_for([p.sentinel for p in procs if p.exitcode is None], timeout=0.2)
            for rank, proc in enumerate(procs):
                if rank not in outcome.exited_at and proc.exitcode is not None:
                    outcome.exited_at[rank] = time.time()
            for tail in tails:
                tail.emit()
            now = time.monotonic()
            if first_failure_at is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure_at = now
            outcome.timed_out = deadline is not None and now > deadline
            if outcome.timed_out or (first_failure_at is not None and now - first_failure_at > FORKED_GRACE_S):
                break
    finally:  # a failure, a timeout, or the caller interrupted: no rank is left behind
        _stop_all(procs, logs, outcome)
        for tail in tails:
            tail.emit(final=True)
    return outcome


def _stop_all(procs: Sequence[Any], logs: Sequence[Path], outcome: _Outcome) -> None:
    """Kill the ranks still running (after a timeout, SIGABRT first: each prints its stacks), reap them all, and
    note their exit codes in ``outcome``."""
    if outcome.timed_out:  # the last lines before the ranks' stacks, then the stacks, into their logs
        outcome.before = {rank: _read_lines(path) for rank, path in enumerate(logs)}
        _abort_with_stacks([p for p in procs if p.exitcode is None and p.pid is not None])
    outcome.stopped = {rank for rank, proc in enumerate(procs) if proc.exitcode is None and proc.pid is not None}
    for rank, proc in enumerate(procs):
        if rank not in outcome.stopped and rank not in outcome.exited_at and proc.pid is not None:
            outcome.exited_at[rank] = time.time()
    for proc in procs:
        if proc.exitcode is None and proc.pid is not None:
            proc.kill()
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=10)
    outcome.codes = {rank: proc.exitcode for rank, proc in enumerate(procs)}
    for proc in procs:
        if proc.pid is not None and proc.exitcode is not None:
            proc.close()


def _failure(outcome: _Outcome, per_rank: Mapping[int, Sequence[str]], notes: Sequence[Mapping[str, Any]],
             script_path: Path, args: Sequence[str], timeout_s: float | None, folder: Path, log: str) -> LaunchError:
    """The :class:`LaunchError` of a forked run that failed or timed out: one line, the details as attributes."""
    name, where, nproc = script_path.name, f"full log: {folder / 'launch.log'}", len(outcome.codes)
    command = [sys.executable, str(script_path), *args]
    codes = outcome.codes
    if outcome.timed_out:
        alive = [r for r, c in codes.items() if c is None or c < 0]
        rank = alive[0] if alive else None
        before = outcome.before.get(rank, []) if rank is not None else []
        last = _last_meaningful([_without_own_prefix(line, rank) for line in before]) if rank is not None else ""
        return LaunchError(f"{name} on {nproc} processes timed out after {timeout_s:g} s and was stopped; last output: "
                           f"[rank{rank}] {last or '(no output)'}; where each rank was is in the {where}",
                           rank=rank, last_line=last, log=log, command=command, records_dir=folder, timed_out=True)
    rank, last = _first_failure(codes, outcome.stopped, notes, per_rank, outcome.exited_at) or (None, "")
    return LaunchError(f"rank {rank} of {name} failed with exit code {_code_text(codes.get(rank))}: "
                       f"{last or '(no output)'} ({where})",
                       rank=rank, exit_code=codes.get(rank), last_line=last, log=log, command=command,
                       records_dir=folder)



class _Tail:
    """The lines a rank has added to its log since the last call, printed with its prefix (live output).

    Bytes are decoded incrementally: a character whose UTF-8 bytes straddle two reads is printed whole, once
    its last byte has arrived."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank, self.offset, self.partial = path, rank, 0, ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def emit(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        self.offset += len(chunk)
        text = self.partial + self.decoder.decode(chunk, final=final)
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        for line in lines if not final else [ln for ln in lines if ln]:
            print(f"[rank{self.rank}] {_without_own_prefix(line, self.rank)}", flush=True)

