"""The cases behind ``dlo check dp_scratch <step>`` (Jour2/dp_scratch_train.py): one function per step, run at any
world size, in a process group of one (the checker's own process) or on several gloo processes
(``checks/dp_scratch_worker.py``). Outside the ``checks`` package so that the worker processes start without
importing every course's checkers.

What is checked is behaviour, end to end, on inputs chosen so that the usual mistakes show:

* every step trains (or broadcasts) and then compares the *weights* with those of one process on the global
  batch, on every rank (so the ranks also agree with each other), besides the gradients;
* the set-ups (:data:`SETUPS`: two fixed, two drawn from a seeded generator): different seeds, fp32 and fp64
  (compared within 1e-6 and 1e-9), a frozen layer (``requires_grad=False``: no gradient at all), two ways of
  dealing the samples to the ranks, other model widths and depths, 2 to 4 micro-batches per step, bucket sizes that
  split the model, give each parameter its own bucket, or hold it all; the bucket plan is also asked on generated
  vectors and matrices of bf16 / fp16 / fp32 / fp64 elements, with bucket sizes on, just under and just over a
  bucket's edge;
* every all-reduce is seen through :func:`dlo.parallel.dp_events.record_collectives` with ``defer=True``:
  an asynchronous result reaches its tensor only when its handle is waited for, and the order of the
  events says whether backward went on between a launch and its wait (overlap) or not;
* the broadcasts of step 2 are first played as if this rank were a receiving one (each call fills its
  tensor with a recognisable value, an asynchronous one only at its wait()), counted and compared across
  ranks, so that a broadcast called on some ranks only is reported instead of hanging the run; then the
  function runs again for real and the state must be rank 0's.

A failure names the mistake when it is a known one; otherwise it gives the measured difference.

The cases live in ``common`` (set-ups, reference, comparisons), ``naive_broadcast`` (steps 1-2),
``overlap_buckets`` (steps 3-4) and ``no_sync`` (step 5).
"""
from __future__ import annotations

from typing import Callable

from .common import (
    TOL, TOLERANCE, STEPS, PER_RANK, LR, K, Bad, load_script, Setup, SETUPS,
)
from .naive_broadcast import (
    case_naive, case_broadcast,
)
from .overlap_buckets import (
    case_overlap, PLAN_PARAMS, PLAN_CAPS, plan_cases, case_buckets,
)
from .no_sync import (
    case_no_sync,
)

CASES: dict[str, Callable[[dict], dict]] = {"naive": case_naive, "broadcast": case_broadcast, "overlap": case_overlap,
                                            "buckets": case_buckets, "no_sync": case_no_sync}


def run_case(step: str, ns: dict) -> dict:
    """``{"verdict": "ok" | message, "diffs": {...}}`` of one step; the student's NotImplementedError propagates."""
    try:
        return {"verdict": "ok", "diffs": CASES[step](ns)}
    except Bad as exc:
        return {"verdict": str(exc), "diffs": {}}


__all__ = [
    "TOL", "TOLERANCE", "STEPS", "PER_RANK", "LR", "K", "Bad", "load_script", "Setup", "SETUPS", "case_naive",
    "case_broadcast", "case_overlap", "PLAN_PARAMS", "PLAN_CAPS", "plan_cases", "case_buckets", "case_no_sync", "CASES",
    "run_case",
]
