"""Checker of the all_to_all dispatch and combine of tp_fsdp/experts.ipynb (``dlo check experts dispatch``).

``dispatch_combine(rows, expert, num_experts, run_local, group=None)`` gets this rank's rows (one per kept routing
decision, in any order) and the global expert of each, must send every row to the rank that holds its expert (``E /
ep`` consecutive experts per rank), have that rank run ``run_local(received, local_expert)`` on the rows it received,
and return the outputs in the order of ``rows``. The checker's ``run_local`` computes a different function per
global expert, so a row sent to the wrong rank, given the wrong local expert, or brought back in the wrong order
shows in the values; it also records what each rank received.

1. In this process, in a process group of one (gloo): the rows must come back in their own order (not sorted), with
   the right local expert ids; and a call with no row must make as many ``all_to_all_single`` calls as a call with
   rows (a rank that skips an exchange leaves its peers waiting: a hang on NCCL).
2. On 3 gloo processes (:mod:`dlo.course.checks.experts_dispatch_worker`), the generated cases of
   :data:`dlo.course.dispatch_cases.CASES`, smallest first: groups of 2 and 3 ranks, explicit groups that are not
   the world (ranks [0, 2], ranks [1, 2]), 1 to 4 experts per rank, uneven counts, a rank that sends nothing, experts
   that get no row. Every exchange's split sizes are compared with the case's before it runs (named on every rank
   alike), each rank's outputs with the single-process reference (:func:`dlo.course.dispatch_cases.verdict`); the
   smallest failing case is reported. The student's function travels as the source text of the cell or file that
   defines it (:func:`dlo.course.exercises.write_answer`).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from dlo.course.checks.ddp import one_process_group
from dlo.course.checks.framework import CheckFailed, expect, peer_records, register
from dlo.course.exercises import write_answer
from dlo.course.dispatch_cases import CASES, WORLD, CheckedAllToAll, case_inputs, verdict

EXPERTS_NB = "tp_fsdp/experts.ipynb"
WORKER = Path(__file__).with_name("experts_dispatch_worker.py")


class _CountCalls:
    """Counts torch.distributed.all_to_all_single calls while installed, and compares their split sizes with the
    case's (:class:`dlo.course.dispatch_cases.CheckedAllToAll`, as on the check's processes)."""

    def __init__(self) -> None:
        self.calls, self.real = 0, dist.all_to_all_single
        self.checked = CheckedAllToAll(self.real)

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self.checked(*args, **kwargs)
        dist.all_to_all_single = counted
        return self

    def __exit__(self, *exc) -> None:
        dist.all_to_all_single = self.real


def _one_process(dispatch_combine: Callable, counter: _CountCalls, rows, expert, num_experts: int, where: str) -> str:
    """The verdict of one call in a group of one process (every expert is local); the answer's error as a verdict."""
    counter.checked.start(None, ([rows.shape[0]], [rows.shape[0]]))
    try:
        return verdict(dispatch_combine, rows, expert, 0, 1, where, num_experts)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the answer's error, in one line
        return f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


@register("experts", "dispatch", ("dispatch_combine",), EXPERTS_NB)
def _check_dispatch(dispatch_combine: Callable) -> str:
    with one_process_group(), _CountCalls() as counter:
        for case in CASES:
            rows, expert = case_inputs(case, 0)
            if rows.shape[0]:  # every expert is local in one process
                result = _one_process(dispatch_combine, counter, rows, expert, case.num_experts,
                                      f"one process, {case.num_experts} experts, {rows.shape[0]} rows")
                expect(result == "ok", result)
        with_rows = counter.calls
        expect(with_rows > 0, "no call to torch.distributed.all_to_all_single was seen: the rows must travel to "
                              "their experts' ranks (call it through the module, dist.all_to_all_single, so that "
                              "the check sees it)")
        counter.calls = 0
        empty = next(c for c in CASES if not c.rows[-1])
        result = _one_process(dispatch_combine, counter, *case_inputs(empty, empty.ep - 1), empty.num_experts,
                              "one process, no row")
        per_call = with_rows // sum(1 for c in CASES if case_inputs(c, 0)[0].shape[0])
        expect(counter.calls == per_call,
               f"with no row to send this rank made {counter.calls} all_to_all_single calls, {per_call} with rows: a "
               "rank with nothing to send must still take part in every exchange, with empty tensors (its peers wait "
               "for it: a hang)")
        expect(result == "ok", result)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            answer = write_answer(dispatch_combine, Path(tmp), "dispatch_combine")
        except ValueError as exc:
            raise CheckFailed(str(exc)) from None
        records = peer_records(WORKER, [str(answer)], WORLD, timeout_s=120)
    wrong = [f"{WORLD} processes, global rank {r['rank']}, {v}" for r in records for v in r["verdicts"] if v != "ok"]
    # the smallest failing case; in it, a named mistake (on the rank that saw it) before its effects on the others
    expect(not wrong, min(wrong, key=lambda v: (_case_number(v), "wrong rank or expert" in v)) if wrong else "")
    return (f"rows sent to their experts' ranks, run there with the right local expert, back in their own order; equal "
            f"to one process on {WORLD} gloo processes in {len(CASES)} generated cases: groups of 2 and 3 ranks, "
            "explicit groups that are not the world, 1 to 4 experts per rank, uneven counts, a rank that sends nothing "
            "and experts that get no row; as many exchanges with no row as with rows")


def _case_number(verdict_line: str) -> int:
    """The case a verdict is about (cases are sorted smallest first: the smallest failing one is reported)."""
    marker = "case "
    at = verdict_line.find(marker)
    return int(verdict_line[at + len(marker):].split()[0]) if at >= 0 else 0
