"""Where am I running, and with whom? Devices, distributed context, records and the launcher.

A distributed PyTorch program is N copies of the same script that must agree on four numbers before they
can talk: *who am I* (``rank``), *how many are we* (``world_size``), *which GPU of this node is mine*
(``local_rank``) and *where do we meet* (``MASTER_ADDR:MASTER_PORT``). Two launchers hand out these
numbers, each in its own environment variables:

* ``torchrun`` (``python -m torch.distributed.run``) starts the N processes itself and sets ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``GROUP_RANK``;
* Slurm's ``srun`` starts the N tasks across the allocated nodes and sets ``SLURM_PROCID``,
  ``SLURM_LOCALID``, ``SLURM_NTASKS`` ... but nothing PyTorch reads directly.

:func:`dist_context` reads either set (torchrun first), :func:`init_distributed` turns it into a process
group, and :func:`launch` starts a script on N processes from a notebook or a test, streaming every
line prefixed with its rank and collecting the JSON records the ranks wrote with :func:`write_record`.

Typical worker script::

    from dlo.runtime import distributed, write_record
    import torch, torch.distributed as dist

    with distributed() as ctx:          # gloo on CPU, nccl on GPU; no-op when run alone
        t = torch.tensor([ctx.rank + 1.0])
        if ctx.is_distributed:
            dist.all_reduce(t)
        write_record({"sum": t.item()})

and from the notebook: ``records = launch("worker.py", nproc=2)``.
"""
from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlo.runtime.forked import FORK_PRELOAD, run_forked
from dlo.runtime.launch_report import (
    _SRUN_PREFIX, _TORCHRUN_PREFIX, LaunchError, _blame, _code_text, _fresh_notes, _last_meaningful,
    _without_own_prefix)
from dlo.runtime.launch_view import FoldedOutput, RanksFailed, folded
from dlo.runtime.launch_request import (
    _can_fork_server, _check_args, _check_nproc, _check_request, _child_env, _records_folder, _usable_cpus,
    launcher_choice)
from dlo.runtime.loopback import LOOPBACK, loopback_network
from dlo.runtime.paths import env_with_dlo
from dlo.runtime.records import read_records


def build_launch_command(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    nproc: int = 2,
    use_srun: bool | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    log_dir: str | os.PathLike | None = None,
) -> list[str]:
    """The command :func:`launch` runs, as a list (no side effects, so it can be shown and tested).

    * Inside a Slurm allocation (``SLURM_JOB_ID`` set) or with ``use_srun=True``:
      ``srun --ntasks N --kill-on-bad-exit=1 --label --export=ALL python script args``. srun starts the
      N tasks on the allocated nodes; ``--label`` prefixes each output line with the task number and
      ``--kill-on-bad-exit`` stops every task as soon as one fails (otherwise the others hang in a collective).
      The tasks may span nodes, so rank 0's store and the ranks' sockets listen where the other nodes can
      reach them (PyTorch's own choice: every interface of the node, inside the cluster's network).
    * Elsewhere: ``python -m dlo.runtime.loopback --standalone --local-addr 127.0.0.1 --nnodes 1
      --nproc-per-node N --tee 3 script args``: torchrun (:mod:`dlo.runtime.loopback` runs it with its stores
      bound to 127.0.0.1, where PyTorch would bind every interface). ``--standalone`` lets torchrun's
      rendezvous take a free port itself (no port clash between runs), ``--local-addr`` is the address its
      ranks meet at, ``--tee 3`` copies each worker's stdout and stderr to the console prefixed
      ``[default<rank>]:``. ``log_dir`` (torchrun's ``--log-dir``) is where it keeps per-rank log files.
    """
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    env = os.environ if environ is None else environ
    if use_srun is None:
        use_srun = bool(env.get("SLURM_JOB_ID"))
    if use_srun:
        return ["srun", "--ntasks", str(nproc), "--kill-on-bad-exit=1", "--label", "--export=ALL",
                sys.executable, str(script), *args]
    cmd = [sys.executable, "-m", "dlo.runtime.loopback", "--standalone", "--local-addr", LOOPBACK, "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--tee", "3"]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    return cmd + [str(script), *args]


def _pump(stream, out: queue.Queue) -> None:
    """Reader thread: hand each line of one pipe to the caller's thread; None marks the end."""
    for line in iter(stream.readline, ""):
        out.put(line)
    out.put(None)


def _stop(proc: subprocess.Popen, grace_s: float = 40.0) -> None:
    """SIGTERM first (torchrun and srun then stop their workers cleanly), SIGKILL if that is not enough."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def launch(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    nproc: int = 2,
    *,
    records_dir: str | os.PathLike | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout_s: float | None = None,
    use_srun: bool | None = None,
    echo: bool = True,
    tracebacks: bool = False,
) -> list[dict]:
    """Run ``script`` on ``nproc`` processes, stream their output, return the records they wrote.

    Every line is printed as it arrives, prefixed with its origin: ``[rank1] ...`` for a worker,
    ``[torchrun] ...`` / ``[srun] ...`` for the launcher itself (``echo=False`` keeps quiet). Printing
    happens in the caller's thread, so it shows up in the right Jupyter cell.

    The workers get ``DLO_RECORDS_DIR`` (``records_dir``, or a fresh ``runs/launch/<script>-<time>-*``
    folder), ``PYTHONUNBUFFERED=1`` (lines arrive live, not in 8 KiB chunks when the process ends),
    ``OMP_NUM_THREADS`` = cores / nproc unless set (N processes each using every core fight for them;
    under srun, ``SLURM_CPUS_PER_TASK``),
    plus ``env`` (a value of None removes that variable). Rank variables of the caller (``RANK``,
    ``WORLD_SIZE``...) are not passed on: each rank gets its own from the launcher. Inside Slurm,
    ``srun`` is used (see :func:`build_launch_command`); elsewhere every server of the run listens on
    127.0.0.1 only (:mod:`dlo.runtime.loopback`).

    If a rank fails, or ``timeout_s`` passes, raises :class:`LaunchError` naming the rank that failed
    first, its exit code and its last meaningful line (usually the exception). The whole log is also
    written to ``<records_dir>/launch.log``.

    Tracebacks are not streamed (:mod:`dlo.runtime.launch_view`): a failing rank's lines stop at its traceback's
    first line, the launcher's own report is held back, and the error is :class:`RanksFailed` (a LaunchError),
    shown in a notebook as one line per failed rank and the log's path. ``tracebacks=True`` streams everything.
    """
    kwargs = dict(records_dir=records_dir, env=env, timeout_s=timeout_s, use_srun=use_srun, echo=echo)
    if tracebacks:
        return _launch(script, args, nproc, **kwargs)
    out = sys.stdout
    view = FoldedOutput(out) if echo else out
    try:
        sys.stdout = view
        try:
            return _launch(script, args, nproc, **kwargs)
        finally:
            view.flush()
            sys.stdout = out
    except LaunchError as err:
        raise folded(err, script, nproc) from None


def _launch(script: str | os.PathLike, args: Sequence[str], nproc: int, *, records_dir: str | os.PathLike | None,
            env: Mapping[str, str | None] | None, timeout_s: float | None, use_srun: bool | None,
            echo: bool) -> list[dict]:
    """:func:`launch`, every line streamed as it comes (``echo``), a plain :class:`LaunchError` on failure."""
    script_path, args, nproc = _check_request(script, args, nproc, timeout_s)
    forked = launcher_choice() == "fork" and _can_fork_server()

    folder = _records_folder(script_path, records_dir)
    child_env = _child_env(env, folder)
    srun = use_srun if use_srun is not None else bool(child_env.get("SLURM_JOB_ID"))
    if forked and not srun:
        return run_forked(script_path, args, nproc, records_dir=folder, env=env, timeout_s=timeout_s, echo=echo)
    child_env = _launcher_env(child_env, srun, use_srun, nproc)
    command = build_launch_command(script_path, args, nproc, srun, child_env, log_dir=folder / "torchrun")
    output = _Output("srun" if srun else "torchrun", echo)
    started = time.time()
    try:
        proc = _start(command, child_env)
        timed_out = _follow(proc, output, timeout_s)
    finally:
        (folder / "launch.log").write_text("\n".join(output.log_lines) + "\n", encoding="utf-8")
    if proc.returncode == 0 and not timed_out:
        return read_records(folder)
    raise _failure(output, script_path, nproc, command, folder, proc.returncode, timeout_s if timed_out else None,
                   _fresh_notes(folder, started))


def _launcher_env(child_env: dict[str, str], srun: bool, use_srun: bool | None, nproc: int) -> dict[str, str]:
    """The ranks' environment under srun (the job's CPUs per task; a job too small is refused in one line) or
    torchrun (cores shared among the ranks, gloo and NCCL on the loopback interface, ``dlo`` importable)."""
    if srun:
        job_tasks = child_env.get("SLURM_NTASKS", "").strip()
        if use_srun is None and job_tasks.isdigit() and int(job_tasks) < nproc:
            raise ValueError(
                f"this Slurm job has {job_tasks} task(s) but launch() asked for nproc={nproc}: "
                f"submit with --ntasks {nproc} (or --ntasks-per-node), "
                "or pass use_srun=False to run torchrun on this node"
            )
        cpus = child_env.get("SLURM_CPUS_PER_TASK")
        if cpus:
            child_env.setdefault("OMP_NUM_THREADS", cpus)
            child_env.setdefault("SRUN_CPUS_PER_TASK", cpus)  # srun >= 22.05 no longer inherits --cpus-per-task
        return child_env
    child_env.setdefault("OMP_NUM_THREADS", str(max(1, _usable_cpus() // nproc)))
    loopback_network(child_env)
    return env_with_dlo(child_env)  # `python -m dlo.runtime.loopback` imports this very dlo


class _Output:
    """The launcher's output, line by line: each worker line filed under its rank and shown ``[rank<r>] ...``,
    the launcher's own ``[torchrun] ...`` / ``[srun] ...``; printed as it arrives when ``echo``."""

    def __init__(self, launcher: str, echo: bool) -> None:
        self.launcher, self.echo = launcher, echo
        self.prefix = _SRUN_PREFIX if launcher == "srun" else _TORCHRUN_PREFIX
        self.log_lines: list[str] = []
        self.per_rank: dict[int, list[str]] = {}
        self.own_lines: list[str] = []
        self.latest: tuple[int, str] | None = None  # the last non-blank line any rank printed (for timeouts)

    def emit(self, raw: str) -> None:
        text = raw.rstrip("\n")
        match = self.prefix.match(text)
        if match is not None:
            rank = int(match.group(1))
            body = _without_own_prefix(match.group(2), rank)
            self.per_rank.setdefault(rank, []).append(body)
            if body.strip():
                self.latest = (rank, body.strip())
            shown = f"[rank{rank}] {body}"
        else:
            self.own_lines.append(text)
            shown = f"[{self.launcher}] {text}"
        self.log_lines.append(shown)
        if self.echo:
            print(shown, flush=True)


def _start(command: Sequence[str], child_env: Mapping[str, str]) -> subprocess.Popen:
    try:
        return subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(child_env),
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,  # our own process group, so a timeout can signal the launcher and only it
        )
    except FileNotFoundError:
        raise RuntimeError(f"cannot start {command[0]!r}: is it installed and on PATH?") from None


def _follow(proc: subprocess.Popen, output: _Output, timeout_s: float | None) -> bool:
    """Hand every line of the launcher's two pipes to ``output`` until both close; stop the launcher at
    ``timeout_s`` (then True) or when the caller is interrupted (the stop button: no worker is left behind)."""
    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_pump, args=(pipe, lines), daemon=True) for pipe in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    open_streams, timed_out, exited_at = 2, False, None
    try:
        while open_streams:
            if deadline is not None and time.monotonic() > deadline and proc.poll() is None:
                timed_out = True
                _stop(proc)
            try:
                raw = lines.get(timeout=0.1)
            except queue.Empty:
                if proc.poll() is not None:
                    # a stray grandchild may keep a pipe open after the launcher exited: do not wait forever
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > 5:
                        break
                continue
            if raw is None:
                open_streams -= 1
            else:
                output.emit(raw)
        proc.wait()
    except BaseException:
        _stop(proc, grace_s=10)
        raise
    return timed_out


def _failure(output: _Output, script_path: Path, nproc: int, command: Sequence[str], folder: Path, returncode: int,
             timed_out_after: float | None, notes: Sequence[Mapping[str, Any]]) -> LaunchError:
    """The :class:`LaunchError` of a torchrun or srun run that failed or timed out (``timed_out_after`` s)."""
    log = "\n".join(output.log_lines)
    name, where = script_path.name, f"full log: {folder / 'launch.log'}"
    if timed_out_after is not None:
        rank, last = output.latest if output.latest is not None else (None, _last_meaningful(output.own_lines))
        shown = f"[rank{rank}] {last}" if rank is not None else (last or "(no output)")
        return LaunchError(
            f"{name} on {nproc} processes timed out after {timed_out_after:g} s and was stopped; "
            f"last output: {shown} ({where})",
            rank=rank, last_line=last, log=log, command=command, records_dir=folder, timed_out=True,
        )
    rank, code, last = _blame(output.own_lines, output.per_rank, notes, output.launcher == "srun", returncode)
    who = f"rank {rank}" if rank is not None else output.launcher
    return LaunchError(
        f"{who} of {name} failed with exit code {_code_text(code)}: {last or '(no output)'} ({where})",
        rank=rank, exit_code=code, last_line=last, log=log, command=command, records_dir=folder,
    )


def launch_forked(
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
    """:func:`dlo.runtime.forked.run_forked`: ``script`` on ``nproc`` ranks forked from a server that has already
    imported ``preload`` (seconds saved per rank), their records returned; where there is no fork server
    (Windows), :func:`launch` with torchrun instead."""
    if not _can_fork_server():
        return launch(script, args, nproc, records_dir=records_dir, env=env, timeout_s=timeout_s, use_srun=False,
                      echo=echo)
    return run_forked(script, args, nproc, records_dir=records_dir, env=env, timeout_s=timeout_s, preload=preload,
                      echo=echo)
