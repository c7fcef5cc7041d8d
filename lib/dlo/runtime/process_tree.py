"""Run a command under a cap, and leave nothing of it behind: its whole family of processes is stopped at the cap.

A step of ``dlo gpu-check`` (a notebook, a benchmark and the torchrun or forked ranks it launches) is many processes:
the command starts in a session of its own (``start_new_session``), but a launcher inside it may start its own
session too (:func:`dlo.runtime.launch.launch` does, for its own timeout), and a process may outlive its parent. So
the family is followed while the command runs: every process descended from it, and every process of a session or
process group one of them led. At the cap (and when the command exits, for what it left running) the family is
frozen with SIGSTOP until no new member appears (a stopped process cannot fork), then killed with SIGKILL, and
:func:`run_capped` returns only once none of them runs any more. Linux (``/proc``); elsewhere only the command's own
session is signalled.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: How often the family of a running command is looked at (seconds).
POLL_S = 0.25


@dataclass(frozen=True)
class Finished:
    """What :func:`run_capped` saw: the exit code (None when stopped at the cap), the output, whether the cap
    stopped it, its seconds, and how many processes of its family were still running and had to be killed."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    killed: int


def _table() -> dict[int, tuple[int, int, int, str, int]]:
    """Every process now: pid -> (parent pid, process group, session, state, start time in clock ticks since boot),
    read from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
            out[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]))
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead and waiting to be reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


class Family:
    """The processes of one command: descendants of ``root``, and members of the sessions and groups they lead.
    A process is known by its pid and start time (a pid reused by another process later is not the same one), and
    none started before the command is ever a member."""

    def __init__(self, root: int) -> None:
        self.root, self.me = root, os.getpid()
        self.leaders: set[int] = {root}  # sessions / process groups known to be the command's
        self.seen: dict[int, int] = {}   # pid -> start time
        self.born = _table().get(root, (0, 0, 0, "", 0))[4]

    def members(self) -> set[int]:
        """Update what is known of the family from the process table and return its live members."""
        table = _table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.root, *(p for p, t in self.seen.items() if p in table and table[p][4] == t)]
        todo += [pid for pid, (_, pgid, sid, _, _) in table.items() if pgid in self.leaders or sid in self.leaders]
        found: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in found or pid == self.me or pid not in table or table[pid][4] < self.born:
                continue
            found.add(pid)
            todo += children.get(pid, [])
        for pid in found:
            _, pgid, sid, _, started = table[pid]
            self.seen[pid] = started
            if pid in (pgid, sid):
                self.leaders.add(pid)
        return {pid for pid in found if table[pid][3] not in ("Z", "X")}

    def kill(self, wait_s: float = 20.0) -> int:
        """Freeze every member (SIGSTOP, until no new one appears), kill them all (SIGKILL), and wait until none
        runs. Returns how many were killed."""
        stopped: set[int] = set()
        for _ in range(100):
            new = self.members() - stopped
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= new
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(running(p) for p in stopped | self.members()):
            time.sleep(0.05)
        return len(stopped)


def _signal_session(pid: int) -> None:
    """Where there is no /proc: SIGKILL to the command's own process group (its session's)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_capped(command: Sequence[str], *, timeout_s: float, cwd: str | os.PathLike | None = None,
               env: Mapping[str, str] | None = None) -> Finished:
    """Run ``command`` in a session of its own for at most ``timeout_s`` seconds; its output is collected in files
    (a grandchild that keeps a pipe open cannot hold the caller). At the cap, or when it exits, every process of its
    family still running is killed, and this returns only once none is left."""
    has_proc = Path("/proc/self/stat").exists()
    start = time.monotonic()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out, \
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(list(command), cwd=cwd, env=None if env is None else dict(env), stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        family = Family(proc.pid)
        timed_out = False
        try:
            while proc.poll() is None:
                if time.monotonic() - start >= timeout_s:
                    timed_out = True
                    break
                if has_proc:
                    family.members()  # learn the sessions its launchers start, while their parents still live
                time.sleep(POLL_S)
        finally:
            killed = family.kill() if has_proc else 0
            if not has_proc:
                _signal_session(proc.pid)
            proc.wait()
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Finished(None if timed_out else proc.returncode, out.read(), err.read(), timed_out, seconds, killed)
