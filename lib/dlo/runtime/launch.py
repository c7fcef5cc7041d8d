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

import codecs
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlo.runtime.records import RECORDS_ENV, _FAILURES_SUBDIR, _RECORD_FILE, read_records
from dlo.runtime.context import free_port
from dlo.runtime.errors import TooFewGPUs
from dlo.runtime.paths import run_dir


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------

#: ``DLO_LAUNCHER=fork`` makes :func:`launch` start its local ranks with :func:`launch_forked` instead of
#: torchrun (``torchrun``, the default, or unset: torchrun). For rehearsals that launch dozens of short runs on
#: a CPU (the ``dry`` profile): each torchrun launch starts N+1 Pythons that import torch (seconds each), forked
#: ranks import it once. Inside a Slurm job srun is still used. What the ranks compute is the same.
LAUNCHER_ENV = "DLO_LAUNCHER"
LAUNCHERS = ("torchrun", "fork")


def _can_fork_server() -> bool:
    import multiprocessing

    return "forkserver" in multiprocessing.get_all_start_methods()  # not on Windows: torchrun it is


def launcher_choice() -> str:
    """The local launcher :func:`launch` uses: ``$DLO_LAUNCHER`` ("torchrun" when unset); one line if unknown."""
    value = os.environ.get(LAUNCHER_ENV, "").strip().lower() or "torchrun"
    if value not in LAUNCHERS:
        raise ValueError(f"{LAUNCHER_ENV}={value!r} is not a launcher: set it to one of {', '.join(LAUNCHERS)}, "
                         "or unset it for torchrun")
    return value

class LaunchError(RuntimeError):
    """A launched run failed. ``str(err)`` is one line; the details are attributes.

    ``rank`` / ``exit_code`` / ``last_line``: the rank blamed (None if unknown) and what it said last;
    ``log``: every output line, rank-prefixed; ``command``: what was run; ``records_dir``: where the
    records, ``launch.log`` and torchrun's per-rank logs are; ``timed_out``: True when stopped by ``timeout_s``.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        last_line: str = "",
        log: str = "",
        command: Sequence[str] = (),
        records_dir: Path | None = None,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.last_line = last_line
        self.log = log
        self.command = list(command)
        self.records_dir = records_dir
        self.timed_out = timed_out



def _check_nproc(nproc: Any) -> int:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    return nproc


def check_processes(nprocs: Any, device: Any, *, least: int = 1, what: str = "this run",
                    gpus: int | None = None) -> list[int]:
    """The process counts a notebook is about to launch, checked before anything starts (one line each).

    ``nprocs``: one count or a list of counts (world sizes). Each must be an integer ``>= least`` (what the
    lesson needs, e.g. 2 for data parallelism); on a CUDA ``device`` none may exceed the GPUs visible here
    (``gpus``, default ``torch.cuda.device_count()``): NCCL gives each process its own GPU, and two ranks of
    one communicator on one GPU are refused at their first collective, after minutes of start-up. On a CPU
    (gloo) more processes than cores only share the cores: that is allowed. Returns the counts as a list."""
    counts = list(nprocs) if isinstance(nprocs, (list, tuple)) else [nprocs]
    bad = [n for n in counts if isinstance(n, bool) or not isinstance(n, int) or n < least]
    if not counts or bad:
        raise ValueError(f"{what} needs at least {least} process(es) per run, got {nprocs!r}: on a node with fewer GPUs "
                         f"use profile 'smoke' (CPU) or 'dry' (the full profile rehearsed on a CPU)")
    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count()
        if max(counts) > gpus:
            raise TooFewGPUs(f"{what} launches {max(counts)} processes but only {gpus} GPU(s) are visible: NCCL "
                             f"needs one GPU per process; use a node with {max(counts)} GPUs, or fewer processes",
                             needed=max(counts), visible=gpus)
    return counts


def _check_args(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)):
        raise ValueError(f"args must be a list of strings like ['--epochs', '3'], not the single string {args!r}")
    return [str(a) for a in args]


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
    * Elsewhere: ``python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node N --tee 3 script args``.
      ``--standalone`` lets torchrun's rendezvous bind a free port itself (no port clash between runs),
      ``--tee 3`` copies each worker's stdout and stderr to the console prefixed ``[default<rank>]:``.
      ``log_dir`` (torchrun's ``--log-dir``) is where it keeps per-rank log files.
    """
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    env = os.environ if environ is None else environ
    if use_srun is None:
        use_srun = bool(env.get("SLURM_JOB_ID"))
    if use_srun:
        return ["srun", "--ntasks", str(nproc), "--kill-on-bad-exit=1", "--label", "--export=ALL",
                sys.executable, str(script), *args]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--tee", "3"]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    return cmd + [str(script), *args]


_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")
_TORCHRUN_PREFIX = re.compile(r"^\[[A-Za-z_][A-Za-z_]*?(\d+)\]:(.*)$", re.S)  # "[default1]:text"
_SRUN_PREFIX = re.compile(r"^\s*(\d+): ?(.*)$", re.S)  # " 1: text" (srun --label)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_SRUN_FAILURE = re.compile(r"task (\d+): Exited with exit code (\d+)")


def _last_meaningful(lines: Sequence[str]) -> str:
    """The exception line after the last traceback, else the last non-blank line."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Traceback (most recent call last)"):
            for line in lines[start + 1 :]:
                if line.strip() and not line[0].isspace():
                    return line.strip()
            break
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""


#: What a rank says when a peer it was talking to is gone: the consequence of another rank's failure, never its cause.
_PEER_LOST = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|remote (?:worker|process|peer)|"
    r"peer crash|connection was likely closed|communicator was aborted|ECONNRESET|EPIPE",
    re.I,
)


def _peer_lost(line: str) -> bool:
    """Whether ``line`` (an exception's first line) says that a peer vanished, not what went wrong itself."""
    return bool(_PEER_LOST.search(line or ""))


def _code_text(code: int | None) -> str:
    """``1``; ``-9 (killed by SIGKILL)`` for a rank killed by a signal."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


def _first_failure(
    codes: Mapping[int, int | None],
    stopped: set[int],
    notes: Sequence[Mapping[str, Any]],
    per_rank: Mapping[int, Sequence[str]],
    exited_at: Mapping[int, float] | None = None,
) -> tuple[int, str] | None:
    """The rank that failed first and its last line, from what each rank left behind; None if nothing failed.

    ``codes``: each rank's exit code where known; ``stopped``: ranks the launcher itself stopped (their codes say
    nothing of their own); ``notes``: the failure notes (rank, time, exception) the ranks wrote as they failed;
    ``exited_at``: when each rank was seen to exit (time.time()), where the launcher saw it.

    1. A rank that failed on its own: a note whose exception is not the loss of a peer ("Connection closed by
       peer", "Broken pipe": that is what the others say once the first one is gone), or a rank that exited with
       an error and no note (a signal, ``os._exit``, ``sys.exit``, a crash in C), its last line not a peer's
       loss either. The earliest wins: a note's time, or when its rank was seen to exit (a late upper bound: a
       rank without a note is preferred only when surely earlier); without exit times, notes first, then the
       lowest rank.
    2. Else the earliest note (a peer's loss), else the lowest rank that exited with an error on its own, else
       the lowest rank stopped by the launcher.
    """
    exited_at = exited_at or {}
    first_note: dict[int, Mapping[str, Any]] = {}
    for note in sorted(notes, key=lambda n: n.get("time", 0)):
        with contextlib.suppress(TypeError, ValueError):
            first_note.setdefault(int(note["rank"]), note)
    last = {r: _last_meaningful(per_rank.get(r, [])) for r in set(codes) | set(first_note)}
    own: list[tuple[float, int, int, str]] = []  # (time, evidence order, rank, line)
    for rank, note in first_note.items():
        if not _peer_lost(str(note.get("exception", ""))):
            own.append((float(note.get("time", 0)), 0, rank, str(note.get("exception", ""))))
    for rank, code in codes.items():
        if rank in first_note or rank in stopped or code in (None, 0) or _peer_lost(last[rank]):
            continue
        when = exited_at.get(rank, float("inf"))
        own.append((when, 1, rank, last[rank]))
    if own:
        _, _, rank, line = min(own)
        return rank, line
    if first_note:
        rank, note = min(first_note.items(), key=lambda rn: rn[1].get("time", 0))
        return rank, str(note.get("exception", ""))
    failed = [r for r, c in codes.items() if c not in (None, 0)]
    if not failed:
        return None
    rank = min([r for r in failed if r not in stopped] or failed)
    return rank, last[rank]


def _blame(
    own_lines: Sequence[str],
    per_rank: Mapping[int, Sequence[str]],
    notes: Sequence[Mapping[str, Any]],
    srun: bool,
    returncode: int,
) -> tuple[int | None, int | None, str]:
    """Which rank to blame for a failed torchrun or srun run: ``(rank or None, exit code, last meaningful line)``.

    The exit codes come from the launcher's own report (torchrun's "rank : 1 ... exitcode : 1" summary, srun's
    "task 1: Exited with exit code 1"); ranks that torchrun stopped itself once another had failed end with
    SIGTERM (-15). :func:`_first_failure` weighs them with the ranks' failure notes. Else nobody in particular:
    the launcher's own last line (it may not have started any rank).
    """
    text = "\n".join(own_lines)
    codes = {int(r): int(c) for r, c in (_SRUN_FAILURE if srun else _TORCHRUN_FAILURE).findall(text)}
    stopped = set() if srun else {r for r, c in codes.items() if c == -signal.SIGTERM}
    found = _first_failure(codes, stopped, notes, per_rank)
    if found is None:
        return None, returncode, _last_meaningful(own_lines)
    rank, line = found
    return rank, codes.get(rank, returncode), line


def _pump(stream, out: queue.Queue) -> None:
    """Reader thread: hand each line of one pipe to the caller's thread; None marks the end."""
    for line in iter(stream.readline, ""):
        out.put(line)
    out.put(None)


def _usable_cpus() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity, unlike os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


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


def expand_runs(args: Any, runs_json: str | None) -> list[tuple[str, Any]]:
    """The configurations of a "several runs in one launch" script: ``[(name, args_for_that_run), ...]``.

    ``runs_json`` (a script's ``--runs`` option) is a JSON list of dicts, each overriding some of the
    parsed ``args`` (an ``argparse.Namespace``) and optionally naming the run (``"name"``, default
    ``run<i>``); None or empty means one run with ``args`` as they are. Starting processes costs seconds,
    so a notebook measures several configurations in one launch. A key that is not an option of the script
    is a one-line error naming the options there are.
    """
    import argparse

    runs = json.loads(runs_json) if runs_json else [{}]
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"--runs must be a JSON list of dicts, got {runs_json!r}")
    out = []
    for i, overrides in enumerate(runs):
        overrides = dict(overrides)
        name = str(overrides.pop("name", f"run{i}"))
        unknown = sorted(set(overrides) - set(vars(args)))
        if unknown:
            raise ValueError(f"--runs entry {name!r} sets unknown option(s) {', '.join(unknown)}: "
                             f"use {', '.join(sorted(vars(args)))}")
        out.append((name, argparse.Namespace(**{**vars(args), **overrides})))
    return out


def _check_request(script: Any, args: Any, nproc: Any, timeout_s: Any) -> tuple[Path, list[str], int]:
    """A launch's arguments checked before anything starts: one clear line for each mistake."""
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    script_path = Path(script).expanduser().resolve()
    if not script_path.is_file():
        raise ValueError(f"script {script} does not exist (resolved to {script_path}): check the path")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    return script_path, args, nproc


def _records_folder(script_path: Path, records_dir: str | os.PathLike | None) -> Path:
    """``records_dir`` (which must hold no records yet), or a fresh ``runs/launch/<script>-<time>-*`` folder."""
    if records_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(tempfile.mkdtemp(prefix=f"{script_path.stem}-{stamp}-", dir=run_dir("launch")))
    folder = Path(records_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if any(_RECORD_FILE.match(p.name) for p in folder.iterdir()):
        raise ValueError(
            f"records folder {folder} already holds rank*.jsonl from an earlier run: "
            "pass an empty folder or records_dir=None"
        )
    return folder


def _child_env(env: Mapping[str, str | None] | None, folder: Path) -> dict[str, str]:
    """The ranks' environment: the caller's without its rank variables (each rank gets its own from the
    launcher, never from the caller, which may itself be a rank), plus ``env`` (None removes a variable)."""
    child_env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(str(key), None)
        else:
            child_env[str(key)] = str(value)
    child_env[RECORDS_ENV] = str(folder)
    child_env["PYTHONUNBUFFERED"] = "1"
    return child_env


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
    ``srun`` is used (see :func:`build_launch_command`).

    If a rank fails, or ``timeout_s`` passes, raises :class:`LaunchError` naming the rank that failed
    first, its exit code and its last meaningful line (usually the exception). The whole log is also
    written to ``<records_dir>/launch.log``.
    """
    script_path, args, nproc = _check_request(script, args, nproc, timeout_s)
    forked = launcher_choice() == "fork" and _can_fork_server()

    folder = _records_folder(script_path, records_dir)
    child_env = _child_env(env, folder)
    srun = use_srun if use_srun is not None else bool(child_env.get("SLURM_JOB_ID"))
    if forked and not srun:
        return launch_forked(script_path, args, nproc, records_dir=folder, env=env, timeout_s=timeout_s, echo=echo)
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
    else:
        child_env.setdefault("OMP_NUM_THREADS", str(max(1, _usable_cpus() // nproc)))
    command = build_launch_command(script_path, args, nproc, srun, child_env, log_dir=folder / "torchrun")
    launcher = "srun" if srun else "torchrun"
    worker_prefix = _SRUN_PREFIX if srun else _TORCHRUN_PREFIX

    log_lines: list[str] = []
    per_rank: dict[int, list[str]] = {}
    own_lines: list[str] = []
    latest: tuple[int, str] | None = None  # the last non-blank line any rank printed (for timeouts)

    def emit(raw: str) -> None:
        nonlocal latest
        text = raw.rstrip("\n")
        match = worker_prefix.match(text)
        if match is not None:
            rank = int(match.group(1))
            body = _without_own_prefix(match.group(2), rank)
            per_rank.setdefault(rank, []).append(body)
            if body.strip():
                latest = (rank, body.strip())
            shown = f"[rank{rank}] {body}"
        else:
            own_lines.append(text)
            shown = f"[{launcher}] {text}"
        log_lines.append(shown)
        if echo:
            print(shown, flush=True)

    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=child_env,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,  # our own process group, so a timeout can signal the launcher and only it
        )
    except FileNotFoundError:
        raise RuntimeError(f"cannot start {command[0]!r}: is it installed and on PATH?") from None

    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_pump, args=(pipe, lines), daemon=True) for pipe in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    started = time.time()
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
                emit(raw)
        proc.wait()
    except BaseException:  # KeyboardInterrupt from the notebook's stop button included: do not leave workers behind
        _stop(proc, grace_s=10)
        raise
    finally:
        (folder / "launch.log").write_text("\n".join(log_lines) + "\n", encoding="utf-8")

    if proc.returncode == 0 and not timed_out:
        return read_records(folder)

    log = "\n".join(log_lines)
    name = script_path.name
    where = f"full log: {folder / 'launch.log'}"
    if timed_out:
        rank, last = latest if latest is not None else (None, _last_meaningful(own_lines))
        shown = f"[rank{rank}] {last}" if rank is not None else (last or "(no output)")
        raise LaunchError(
            f"{name} on {nproc} processes timed out after {timeout_s:g} s and was stopped; "
            f"last output: {shown} ({where})",
            rank=rank, last_line=last, log=log, command=command, records_dir=folder, timed_out=True,
        )

    notes = []
    for path in (folder / _FAILURES_SUBDIR).glob("rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            note = json.loads(path.read_text(encoding="utf-8"))
            if note.get("time", 0) >= started:  # ignore notes left by an earlier run in the same folder
                notes.append(note)
    rank, code, last = _blame(own_lines, per_rank, notes, srun, proc.returncode)
    who = f"rank {rank}" if rank is not None else launcher
    raise LaunchError(
        f"{who} of {name} failed with exit code {_code_text(code)}: {last or '(no output)'} ({where})",
        rank=rank, exit_code=code, last_line=last, log=log, command=command, records_dir=folder,
    )


# ----------------------------------------------------------------------------------------------------
# Forked launcher: many short runs of a script that imports torch (checkers, tests)
# ----------------------------------------------------------------------------------------------------

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
    """Run ``script`` on ``nproc`` local processes like :func:`launch` does with torchrun, but start each
    rank by forking a server process that has already imported ``preload``, and return their records.

    Why: a rank that starts Python and imports torch spends seconds before its first line of work, and
    torchrun itself is one more such process. A checker or a test that runs a script on 2-4 processes
    dozens of times pays that start-up every time; forked ranks pay it once (``multiprocessing``'s
    ``forkserver``: the server never runs a torch operation, so no thread pool is copied into a fork).

    Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` =
    127.0.0.1 and a free ``MASTER_PORT``, the caller's environment (without its rank variables) plus
    ``env``, and runs ``script`` as ``__main__`` with ``sys.argv = [script, *args]``. Its records and its
    output (``rank<r>.log``) go to ``records_dir`` (as for :func:`launch`). A failure raises :class:`LaunchError` like :func:`launch` (the rank that
    failed first and its last meaningful line); once one rank fails, the others get
    :data:`FORKED_GRACE_S` seconds to finish, then are killed. Local only: use :func:`launch` for
    torchrun's elastic agent or for srun under Slurm. ``echo=True`` prints the ranks' lines as they are
    written, prefixed ``[rank<r>]`` as :func:`launch` does (:func:`launch` calls this under ``DLO_LAUNCHER=fork``).
    """
    import multiprocessing
    from multiprocessing.connection import wait as wait_for

    script_path, args, nproc = _check_request(script, args, nproc, timeout_s)
    if not _can_fork_server():  # Windows: torchrun it is
        return launch(script_path, args, nproc, records_dir=records_dir, env=env, timeout_s=timeout_s, use_srun=False,
                      echo=echo)

    folder = _records_folder(script_path, records_dir)
    base_env = _child_env(env, folder)
    base_env.setdefault("OMP_NUM_THREADS", str(max(1, _usable_cpus() // nproc)))
    base_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))  # applies when the server starts (the first launch)
    logs = [folder / f"rank{rank}.log" for rank in range(nproc)]
    procs = [ctx.Process(target=_forked_rank, name=f"{script_path.stem}-rank{rank}",
                         args=(str(script_path), args, {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                               str(logs[rank])))
             for rank in range(nproc)]
    started = time.time()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first_failure_at, timed_out = None, False
    exited_at: dict[int, float] = {}  # when each rank was seen to exit (time.time(), as the failure notes)
    tails = [_Tail(path, rank) for rank, path in enumerate(logs)] if echo else []
    try:
        for proc in procs:
            proc.start()
        while any(p.exitcode is None for p in procs):
            wait_for([p.sentinel for p in procs if p.exitcode is None], timeout=0.2)
            for rank, proc in enumerate(procs):
                if rank not in exited_at and proc.exitcode is not None:
                    exited_at[rank] = time.time()
            for tail in tails:
                tail.emit()
            now = time.monotonic()
            if first_failure_at is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure_at = now
            if deadline is not None and now > deadline:
                timed_out = True
            if timed_out or (first_failure_at is not None and now - first_failure_at > FORKED_GRACE_S):
                break
    finally:  # a failure, a timeout, or the caller interrupted: no rank is left behind
        if timed_out:  # the last lines before the ranks' stacks, then the stacks, into their logs
            before = {rank: _read_lines(path) for rank, path in enumerate(logs)}
            _abort_with_stacks([p for p in procs if p.exitcode is None and p.pid is not None])
        stopped = {rank for rank, proc in enumerate(procs) if proc.exitcode is None and proc.pid is not None}
        for rank, proc in enumerate(procs):
            if rank not in stopped and rank not in exited_at and proc.pid is not None:
                exited_at[rank] = time.time()
        for proc in procs:
            if proc.exitcode is None and proc.pid is not None:
                proc.kill()
        for proc in procs:
            if proc.pid is not None:
                proc.join(timeout=10)
        codes = {rank: proc.exitcode for rank, proc in enumerate(procs)}
        for proc in procs:
            if proc.pid is not None and proc.exitcode is not None:
                proc.close()
        for tail in tails:
            tail.emit(final=True)
    per_rank = {rank: [_without_own_prefix(line, rank) for line in _read_lines(path)] for rank, path in enumerate(logs)}
    log = "\n".join(f"[rank{rank}] {line}" for rank, lines in per_rank.items() for line in lines)
    (folder / "launch.log").write_text(log + "\n", encoding="utf-8")
    if not timed_out and all(c == 0 for c in codes.values()):
        return read_records(folder)

    name, where = script_path.name, f"full log: {folder / 'launch.log'}"
    command = [sys.executable, str(script_path), *args]
    if timed_out:
        alive = [r for r, c in codes.items() if c is None or c < 0]
        rank = alive[0] if alive else None
        last = _last_meaningful([_without_own_prefix(line, rank) for line in before[rank]]) if rank is not None else ""
        raise LaunchError(f"{name} on {nproc} processes timed out after {timeout_s:g} s and was stopped; last output: "
                          f"[rank{rank}] {last or '(no output)'}; where each rank was is in the {where}",
                          rank=rank, last_line=last, log=log, command=command, records_dir=folder, timed_out=True)
    notes = []
    for path in (folder / _FAILURES_SUBDIR).glob("rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            note = json.loads(path.read_text(encoding="utf-8"))
            if note.get("time", 0) >= started:
                notes.append(note)
    rank, last = _first_failure(codes, stopped, notes, per_rank, exited_at) or (None, "")
    raise LaunchError(f"rank {rank} of {name} failed with exit code {_code_text(codes.get(rank))}: "
                      f"{last or '(no output)'} ({where})",
                      rank=rank, exit_code=codes.get(rank), last_line=last, log=log, command=command,
                      records_dir=folder)


def _without_own_prefix(line: str, rank: int) -> str:
    """``line`` without torch.distributed's own ``[rank1]: `` prefix (it adds one to uncaught-exception lines):
    the launcher prefixes every line itself, and one prefix is enough."""
    own = f"[rank{rank}]:"
    return line[len(own):].removeprefix(" ") if line.startswith(own) else line


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


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
