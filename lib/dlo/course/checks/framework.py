"""Exercise checkers: each one calls the student's function on small inputs and checks its *behaviour*.

In a notebook, the cell after an exercise runs ``check("jour1", "amp", globals())``: it prints a line
starting with "PASSED" or raises :class:`CheckFailed` with a hint. From a terminal,
``dlo check jour1 amp`` loads the exercise cells of the student notebook (cells tagged ``setup`` and
``exercise``) and runs the same checker. A wrong answer reads the same in both places: one line
``NOT YET course/step: what is wrong -- hint: dlo hint course step`` (:meth:`CheckFailed.one_line`).

A checker must fail on the generated stub (which raises NotImplementedError) and pass on the solution;
tests/test_checks.py verifies both for every step.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from dlo.course.exercises import load_exercises
from dlo.course.catalog import unknown_name
from dlo.runtime.launch import LaunchError, launch_forked
from dlo.runtime.paths import ROOT
from dlo.runtime.records import read_records


_GREEN, _RED, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[0m"


def _in_ipython() -> bool:
    """True inside IPython / Jupyter (where the one-line, coloured results are shown)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return bool(get and get() is not None)


class CheckFailed(AssertionError):
    """The answer is not right yet; the message says what was expected.

    In IPython / Jupyter it shows as one red line, ``NOT YET course/step: what is wrong -- hint: dlo hint course
    step``, with no traceback (IPython calls ``_render_traceback_`` instead of printing one). Elsewhere it is an
    ordinary exception: ``dlo check`` and batch runs still fail with a non-zero exit code.
    """

    def __init__(self, message: str = "", course: str | None = None, step: str | None = None) -> None:
        super().__init__(message)
        self.course, self.step = course, step

    def one_line(self) -> str:
        message = " ".join(str(self).split())
        if self.course and self.step:
            prefix = f"{self.course}/{self.step}: "
            message = message[len(prefix):] if message.startswith(prefix) else message
            pointer = f"dlo hint {self.course} {self.step}"
            return f"NOT YET {self.course}/{self.step}: {message}" + ("" if pointer in message else f" — hint: {pointer}")
        return f"NOT YET: {message}"

    def _render_traceback_(self) -> list[str]:
        return [f"{_RED}{self.one_line()}{_RESET}"]


@dataclass(frozen=True)
class Check:
    course: str
    step: str
    functions: tuple[str, ...]
    run: Callable[..., str]
    notebook: str  # source notebook, relative to the project root

    @property
    def student_notebook(self) -> Path:
        src = ROOT / self.notebook
        return src.parent / "student" / src.name


REGISTRY: dict[str, dict[str, Check]] = {}

#: Set to "1" by a profile rehearsal (:func:`dlo.course.gpu_check.rehearse_notebook`, the ``dry`` profile of a
#: source notebook, whose solutions are in place): :func:`check` then only verifies that the step's functions are
#: defined. What a checker does does not depend on the profile, and the smoke run of every notebook (nbval) and
#: tests/test_checks.py run every checker on the solutions; a rehearsal that ran them again would spend its time
#: (and on a GPU node, GPU minutes) proving nothing new.
SKIP_ENV = "DLO_SKIP_CHECKS"


def register(course: str, step: str, functions: tuple[str, ...], notebook: str):
    def deco(fn: Callable[..., str]) -> Callable[..., str]:
        REGISTRY.setdefault(course, {})[step] = Check(course, step, functions, fn, notebook)
        return fn

    return deco


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def check(course: str, step: str, namespace: dict[str, Any] | None = None, **functions: Callable) -> str:
    """Run the checker of ``course``/``step`` on functions found in ``namespace`` (e.g. ``globals()``)."""
    problem = unknown_name(course, step, REGISTRY)
    if problem:
        raise ValueError(problem)
    chk = REGISTRY[course][step]
    ns = dict(namespace or {}, **functions)
    missing = [f for f in chk.functions if f not in ns]
    if missing:
        raise CheckFailed(f"{course}/{step}: define {', '.join(missing)} first (run its exercise cell)", course, step)
    if os.environ.get(SKIP_ENV) == "1":
        message = f"SKIPPED {course}/{step}: checks are not run in a profile rehearsal ({SKIP_ENV}=1)"
        print(message)
        return message
    try:  # the student's prints on the checker's fake inputs (e.g. simulated OOMs) would only confuse
        with contextlib.redirect_stdout(io.StringIO()):
            detail = chk.run(*(ns[f] for f in chk.functions))
    except NotImplementedError as exc:
        raise CheckFailed(f"{course}/{step}: not implemented yet -- {exc}", course, step) from None
    except CheckFailed as exc:
        raise CheckFailed(f"{course}/{step}: {exc}", course, step) from None
    message = f"PASSED {course}/{step}: {detail}"
    print(f"{_GREEN}{message}{_RESET}" if _in_ipython() else message)
    return message


def check_notebook(course: str, step: str, notebook: str | os.PathLike | None = None) -> str:
    """``dlo check``: run a step's checker on the exercise cells of a notebook (default: the student one)."""
    if course not in REGISTRY or step not in REGISTRY[course]:
        return check(course, step, {})  # raises the one-line "unknown ..." error
    path = Path(notebook) if notebook else REGISTRY[course][step].student_notebook
    if not path.is_file():
        raise FileNotFoundError(f"no notebook or script at {path}: run `make student` or pass --notebook PATH")
    return check(course, step, load_exercises(path))


# The other courses' checkers (``checks_*.py`` modules next to this one) register themselves on import.


#: Launch failures that say the processes could not connect (a busy machine, a port taken between its
#: choice and its use), not that an answer is wrong.
_CONNECT_ERRORS = ("connectFullMesh", "Connection reset", "EADDRINUSE", "Address already in use")

#: What every checker's worker imports, loaded once in the server its ranks are forked from.
_WORKER_PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "dlo", "dlo.runtime.distributed",
                   "dlo.runtime.records", "dlo.course.exercises", "dlo.models.llama", "dlo.parallel.comm",
                   "dlo.parallel.fsdp", "dlo.course.dp_scratch_cases")


def peer_records(worker: str | os.PathLike, args: list[str], nproc: int, *, timeout_s: float = 600) -> list[dict]:
    """Run a checker's ``worker`` script on ``nproc`` gloo processes and return every rank's record, by rank.

    What a multi-process checker needs from a launch, in one place: ranks forked from a process that has
    already imported torch (:func:`dlo.runtime.launch.launch_forked`: a check starts in a fraction of a
    second instead of seconds per rank), one thread per process (``OMP_NUM_THREADS=1``), no srun, a retry when the processes could not even connect (a busy machine, not
    the answer's fault), and a run in which every rank answered before one of them failed to leave (a gloo
    thread dying at exit under load) still read, since the answers are what is checked. Anything else is a
    :class:`CheckFailed` with the failing rank's last line.
    """
    for attempt in (1, 2):
        try:
            records = launch_forked(worker, args, nproc=nproc, timeout_s=timeout_s, env={"OMP_NUM_THREADS": "1"},
                                    preload=_WORKER_PRELOAD)
            return sorted(records, key=lambda r: r["rank"])
        except LaunchError as exc:
            if attempt == 1 and any(s in str(exc.last_line) for s in _CONNECT_ERRORS):
                continue
            try:
                records = read_records(exc.records_dir) if exc.records_dir else []
            except ValueError:  # a half-written record: the run really failed
                records = []
            if sorted(r.get("rank") for r in records) == list(range(nproc)):
                return sorted(records, key=lambda r: r["rank"])
            raise CheckFailed(f"the {nproc}-process check run failed: {exc.last_line}") from None
    raise AssertionError("unreachable")  # pragma: no cover
