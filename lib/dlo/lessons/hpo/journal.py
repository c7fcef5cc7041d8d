"""Helpers of the hyper-parameter search notebook (Jour4/hpo.ipynb): Optuna and Ray Tune, sized for a CPU.

- :data:`TOY_FUNCTIONS`: Rosenbrock and Himmelblau, two cheap 2-D functions with known minima, to watch
  how samplers (grid, random, TPE, CMA-ES, ...) spend a budget of trials.
- Search spaces: :func:`validate_space` checks a definition ``{name: spec}`` before anything is
  sampled (one clear error for a duplicated name, an empty range, a log scale that reaches 0, an
  unknown type), :func:`suggest` samples it on an Optuna trial, :func:`to_optuna` / :func:`to_ray` turn
  it into Optuna distributions or Ray Tune domains, so both libraries search the *same* space.
  :class:`StrictTrial` catches the classic pitfall at run time: two hyper-parameters sampled under
  one name are silently tied together by Optuna (the second call returns the first value).
- :func:`journal_storage`: Optuna's journal file storage, the one that works on the NFS/Lustre file
  systems of clusters, with a clear error when the path is not writable; :func:`launch_workers` starts
  processes that optimise one study together (``python -m dlo hpo worker ...``).
- :func:`load_cifar_tensors` and :class:`Trainer`: a small CIFAR-10 training (a narrow ResNet-18 or an
  MLP) on tensors held in memory, one epoch per call, with a state for checkpoints (Ray's PBT).
- :func:`ray_start`: ``ray.init`` for a notebook: a fixed number of CPUs, no dashboard, no usage
  statistics sent anywhere, its temporary folder (and its authentication token) in the project's
  ``.cache/`` when the path is short enough for Ray's Unix sockets.
- :func:`tune_progress` records what a Ray Tune run reports (and shows a progress bar), :func:`pbt_exploits`
  reads what Population Based Training did; :func:`study_summary`, :func:`ray_summary` and
  :func:`best_so_far` make the rows and curves of the comparisons.

Command line (the notebook's parallel workers)::

    python -m dlo hpo worker --journal runs/hpo/journal.log --study toy --function himmelblau --n-trials 20 --seed 1
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


from dlo.runtime.paths import probe_writable
from dlo.lessons.hpo.toys import TOY_FUNCTIONS, toy_function


# --------------------------------------------------------------------------------------------------
# Journal storage: one study, several processes, a shared file system
# --------------------------------------------------------------------------------------------------


class JournalPathError(ValueError):
    """The journal file cannot be used; the message says why and what to do."""


class JournalCorrupt(ValueError):
    """A record of the journal file cannot be read; the message (one line) names the file and the line."""


class JournalWriteError(OSError):
    """A record could not be appended to the journal file (a full disk, a quota); the message (one line) names the
    file. The part of the record that was written is taken back, so the study stays readable."""


LOCK_GRACE_S = 10  # a journal lock older than this is a dead writer's: Optuna's default (30 s) stalls the next worker
_RECORD_START = b'{"op_code"'  # how every record of an Optuna journal begins (json.dumps, compact separators)
_write = os.write  # one system call; a test replaces it with one that finds the disk full


class _SafeJournal:
    """Optuna's journal file, with three changes.

    * Before appending, under the journal's lock, a last line without its newline is cut off: it is the record of a
      writer that died while writing (a writer holds the lock until its record is whole). Optuna appends after it,
      and the file is then unreadable for ever ("Expecting ',' delimiter").
    * A line spoilt that way by a plain Optuna writer (a cut record, then a whole one on the same line) is read as
      the whole record at its end; any other unreadable line is :class:`JournalCorrupt`, naming the file and the line.
    * A failed append (``OSError``: a full disk) takes back what it wrote, then raises :class:`JournalWriteError`
      naming the file.

    Written as a mixin of plain methods: :func:`_journal_backend_class` puts it in front of Optuna's class on first
    use, so that importing this module does not import Optuna (a GPU node may not have it).
    """

    def _corrupt(self, number: int, why: str) -> JournalCorrupt:
        return JournalCorrupt(f"journal file {self._file_path} line {number}: {why}; it cannot be read as an "
                              "Optuna record (was it edited, or written by something else?)")

    def _decode(self, line: bytes, number: int) -> dict[str, Any]:
        try:
            return self._shaped(json.loads(line), number)
        except ValueError as exc:
            if isinstance(exc, JournalCorrupt):
                raise
            why = getattr(exc, "msg", str(exc))
        start = line.rfind(_RECORD_START)
        if start > 0:  # a cut record followed by a whole one on the same line: the whole one
            with contextlib.suppress(ValueError):
                record = json.loads(line[start:])
                if isinstance(record, dict):
                    return record
        raise self._corrupt(number, why)

    def _shaped(self, record: Any, number: int) -> dict[str, Any]:
        """``record`` when it has the shape of an Optuna journal record (an object with an integer ``op_code`` of a
        known operation and a text ``worker_id``), else :class:`JournalCorrupt` naming the line."""
        if not isinstance(record, dict):
            raise self._corrupt(number, f"a JSON {type(record).__name__}, not a record")
        from optuna.storages.journal._storage import JournalOperation  # the operations Optuna's replay knows

        op, worker = record.get("op_code"), record.get("worker_id")
        if isinstance(op, bool) or not isinstance(op, int) or op not in {o.value for o in JournalOperation}:
            raise self._corrupt(number, f"op_code {op!r} is not an Optuna journal operation")
        if not isinstance(worker, str):
            raise self._corrupt(number, f"worker_id {worker!r} is not a text")
        return record

    def read_logs(self, log_number_from: int):
        offsets = self._log_number_offset
        with open(self._file_path, "rb") as f:
            remaining = os.fstat(f.fileno()).st_size  # records appended while reading are for the next call
            start = 0
            if log_number_from in offsets:
                f.seek(offsets[log_number_from])
                start = log_number_from
                remaining -= offsets[log_number_from]
            for number, line in enumerate(f, start=start):
                remaining -= len(line)
                if remaining < 0 or not line.endswith(b"\n"):
                    break  # being written now, or cut: removed by the next append
                offsets.setdefault(number + 1, offsets[number] + len(line))
                if number >= log_number_from:
                    yield self._decode(line, number + 1)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        from optuna.storages.journal._file import get_lock_file

        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode("utf-8")
        with get_lock_file(self._lock):
            try:
                fd = os.open(self._file_path, os.O_RDWR)
            except OSError as exc:
                raise self._write_error(exc) from None
            try:
                end = self._drop_cut_record(fd)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[_write(fd, view):]
                    os.fsync(fd)
                except OSError as exc:
                    with contextlib.suppress(OSError):  # take back the part written: the file stays readable
                        os.ftruncate(fd, end)
                        os.fsync(fd)
                    raise self._write_error(exc) from None
            finally:
                os.close(fd)

    def _drop_cut_record(self, fd: int) -> int:
        """Cut off a last line without its newline (we hold the lock: its writer is dead); the file's new size."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            os.lseek(fd, size, os.SEEK_SET)
            return size
        end, chunk = size, 1 << 16
        while end > 0:
            begin = max(0, end - chunk)
            found = os.pread(fd, end - begin, begin).rfind(b"\n")
            if found >= 0:
                end = begin + found + 1
                break
            end = begin
        os.ftruncate(fd, end)
        os.lseek(fd, end, os.SEEK_SET)
        return end

    def _write_error(self, exc: OSError) -> JournalWriteError:
        import errno

        reason = "no space left on its device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        err = JournalWriteError(f"journal file {self._file_path}: cannot append a record ({reason}); nothing of it "
                                "was kept: free space (or fix the cause) and run the worker again")
        err.errno = exc.errno
        return err


def _journal_backend_class():
    """:class:`JournalFileBackend` made safe against a record cut in the middle (a writer killed while writing, a
    full disk): :class:`_SafeJournal` in front of Optuna's class, built on first use."""
    from optuna.storages.journal import JournalFileBackend

    class SafeJournalFileBackend(_SafeJournal, JournalFileBackend):
        __doc__ = _SafeJournal.__doc__

    return SafeJournalFileBackend


def journal_storage(path: str | os.PathLike, *, lock_grace_s: int = LOCK_GRACE_S):
    """An Optuna ``JournalStorage`` on the file ``path`` (created if needed; its folder must exist).

    Every process that opens the same file works on the same studies. The file is an append-only log of
    operations; a writer takes a lock made by an atomic ``symlink`` (``JournalFileSymlinkLock``), which
    NFS and Lustre support, unlike the ``fcntl`` locks SQLite relies on. Raises :class:`JournalPathError`
    (one line) when the path is a folder or cannot be written. A writer holds the lock for milliseconds;
    a lock older than ``lock_grace_s`` seconds is left by a killed process and is broken. A record cut in the
    middle (a writer killed while writing, a full disk) is removed before the next append; an unreadable record
    is :class:`JournalCorrupt` and a failed append :class:`JournalWriteError`, each one line naming the file.
    """
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileSymlinkLock

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise JournalPathError(f"journal path must be a file path (str or Path), got {path!r}")
    path = Path(path).expanduser()
    hint = "give a file in a folder you can write to (on a cluster: a shared file system such as $WORK or $SCRATCH)"
    if path.is_dir():
        raise JournalPathError(f"journal path {path} is a folder: {hint}, e.g. {path / 'journal.log'}")
    if not path.parent.is_dir():
        raise JournalPathError(f"journal file {path} is not writable (its folder {path.parent} does not exist): {hint}")
    try:
        with open(path, "ab"):
            pass
        probe_writable(path.parent, create=False)  # the lock is a file created next to the journal
    except OSError as exc:
        raise JournalPathError(f"journal file {path} is not writable ({exc.strerror or exc}): {hint}") from None
    backend = _journal_backend_class()(str(path),
                                       lock_obj=JournalFileSymlinkLock(str(path), grace_period=lock_grace_s))
    return _storage_class(JournalStorage)(backend)


def _storage_class(base: type) -> type:
    """Optuna's ``JournalStorage`` whose replay of the records says, in one :class:`JournalCorrupt` line naming the
    file, that a record has the wrong shape (a field of the wrong type or missing), instead of Optuna's
    ``TypeError`` / ``KeyError`` / ``AssertionError`` from deep inside the replay."""

    class SafeJournalStorage(base):
        def _sync_with_backend(self) -> None:
            try:
                super()._sync_with_backend()
            except JournalCorrupt:
                raise
            except (TypeError, KeyError, AssertionError, AttributeError, IndexError, ValueError) as exc:
                where = getattr(self._backend, "_file_path", "?")
                number = self._replay_result.log_number_read
                why = " ".join(str(exc).split()) or type(exc).__name__
                raise JournalCorrupt(f"journal file {where} line {number}: a record of the wrong shape "
                                     f"({type(exc).__name__}: {why}); it cannot be read as an Optuna record "
                                     "(was it edited, or written by something else?)") from None

    return SafeJournalStorage


def fail_dead_trials(storage, study_name: str) -> list[int]:
    """Mark FAILED the RUNNING trials of ``study_name`` whose worker process is dead; returns their numbers.

    A worker killed in the middle of a trial (Slurm's time limit, an out-of-memory kill) never reports it: with
    a journal file there is no heartbeat, so the trial would stay RUNNING forever, and a study that waits for
    its trials, or counts them, would be wrong. Every trial started by :func:`run_worker` records its host and
    pid; a trial of this host whose pid no longer exists is failed here (call it when a study is resumed). A
    trial of another host cannot be checked from here: it is left as it is (resume on that host, or use a
    storage with heartbeats such as an RDB one).
    """
    import optuna
    from optuna.trial import TrialState

    host = socket.gethostname()
    study = optuna.load_study(study_name=study_name, storage=storage)
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if t.user_attrs.get("host") != host or not isinstance(pid, int) or _alive(pid):
            continue
        storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        failed.append(t.number)
    return failed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def run_worker(journal: str | os.PathLike, study_name: str, function: str, n_trials: int, *, seed: int,
               worker: int = 0, sleep_s: float = 0.0) -> dict[str, Any]:
    """Optimise a toy function on an existing study of the journal: ``n_trials`` trials, then a summary.

    Each worker needs its *own* sampler seed: with the same seed, two workers would propose the same
    points. ``sleep_s`` stands for the cost of a real training step, so that trials overlap in time.
    """
    import optuna

    fn = toy_function(function)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = journal_storage(journal)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage,
                                  sampler=optuna.samplers.TPESampler(seed=seed))
    except KeyError:
        raise ValueError(f"no study {study_name!r} in {journal}: create it first (optuna.create_study(storage=..., "
                         f"study_name={study_name!r}))") from None

    dead = fail_dead_trials(storage, study_name)
    if dead:
        print(f"[worker {worker}] trials {dead} of a killed worker marked FAILED", flush=True)

    start = time.perf_counter()
    try:
        for _ in range(n_trials):
            _run_one_trial(study, storage, fn.objective, owner={"worker": worker, "host": socket.gethostname(),
                                                                 "pid": os.getpid()}, sleep_s=sleep_s)
    except Exception as exc:  # noqa: BLE001 - re-raised, or the journal's own one-line error in its place
        cause = _journal_error(exc)
        if cause is None or cause is exc:
            raise
        raise cause from None
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == worker]
    return {"worker": worker, "pid": os.getpid(), "seed": seed, "trials": len(mine),
            "best_own": min(t.value for t in mine if t.value is not None),
            "trials_in_study_at_end": len(study.trials), "seconds": time.perf_counter() - start}


def _run_one_trial(study, storage, objective, *, owner: dict[str, Any], sleep_s: float) -> None:
    """One trial whose owner (worker number, host, pid) is written *with* the trial, in the journal record that
    creates it: a worker killed at any moment -- even between Optuna creating the trial and the objective's first
    line -- leaves a RUNNING trial that :func:`fail_dead_trials` can recognise as its own. (``study.optimize``
    creates the trial first and lets the objective record its owner afterwards: a kill in between left a trial that
    nothing could ever clean.) Then what ``study.optimize`` does: ask, evaluate, tell."""
    import optuna
    from optuna.trial import TrialState

    template = optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs=owner)
    trial = optuna.Trial(study, storage.create_new_trial(study._study_id, template_trial=template))
    try:
        value = objective(trial)
        if sleep_s:
            time.sleep(sleep_s)
    except optuna.TrialPruned:
        study.tell(trial, state=TrialState.PRUNED)
        return
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    study.tell(trial, value)


def _journal_error(exc: BaseException) -> BaseException | None:
    """The journal's own error (a full disk, an unreadable record) behind ``exc``, if any. When a trial's result
    cannot be written, Optuna's clean-up raises ``AssertionError: Should not reach.`` in its place."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (JournalWriteError, JournalCorrupt)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def launch_workers(journal: str | os.PathLike, study_name: str, *, n_workers: int = 2, n_trials: int = 10,
                   function: str = "himmelblau", seed: int = 0, sleep_s: float = 0.0,
                   timeout_s: float = 300) -> list[dict[str, Any]]:
    """Start ``n_workers`` processes (``python -m dlo hpo worker``) on one study and wait for them.

    Worker ``i`` uses sampler seed ``seed + i``. Returns each worker's summary; a failing worker raises
    a RuntimeError with its last error line.
    """
    if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    journal_storage(journal)  # fail here, in one line, rather than in every worker
    toy_function(function)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    for i in range(n_workers):
        cmd = [sys.executable, "-m", "dlo", "hpo", "worker", "--journal", str(journal), "--study", study_name,
               "--function", function, "--n-trials", str(n_trials), "--seed", str(seed + i), "--worker", str(i),
               "--sleep", str(sleep_s)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    summaries = []
    for i, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"worker {i} did not finish within {timeout_s} s") from None
        if proc.returncode != 0:
            last = [ln for ln in err.strip().splitlines() if ln.strip()]
            raise RuntimeError(f"worker {i} failed (exit {proc.returncode}): {last[-1] if last else 'no message'}")
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return summaries


# --------------------------------------------------------------------------------------------------
# Comparison tables
# --------------------------------------------------------------------------------------------------


def study_summary(study, wall_s: float, name: str | None = None) -> dict[str, Any]:
    """One row: trials finished / pruned, best value, epochs trained (reported steps), wall time."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    epochs = sum(max(t.intermediate_values) if t.intermediate_values else 0 for t in trials)
    return {"method": name or study.study_name, "trials": len(trials), "complete": len(complete),
            "pruned": len(pruned), "best value": study.best_value if complete else math.nan,
            "epochs trained": epochs, "wall time (s)": wall_s}


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlo hpo", description="Optuna workers sharing a journal study.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="optimise a toy function on an existing study of a journal file")
    w.add_argument("--journal", required=True, help="journal file shared by the workers")
    w.add_argument("--study", required=True, help="study name (create it first)")
    w.add_argument("--function", default="himmelblau", help=f"one of: {', '.join(TOY_FUNCTIONS)}")
    w.add_argument("--n-trials", type=int, default=10)
    w.add_argument("--seed", type=int, default=0, help="sampler seed: give each worker its own")
    w.add_argument("--worker", type=int, default=0, help="worker number, stored with each of its trials")
    w.add_argument("--sleep", type=float, default=0.0, help="seconds of pretend work per trial")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.n_trials < 1:
            raise ValueError(f"--n-trials must be >= 1, got {args.n_trials}")
        summary = run_worker(args.journal, args.study, args.function, args.n_trials, seed=args.seed,
                             worker=args.worker, sleep_s=args.sleep)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
