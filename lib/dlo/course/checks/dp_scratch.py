"""Checkers of Jour2/dp_scratch_train.py (``dlo check dp_scratch <step>``): data parallelism written by hand.

Each step is checked twice, by the same case function (:func:`dlo.course.dp_scratch_cases.run_case`), which works
at any world size:

1. in this process, in a process group of one (gloo): an unfinished step fails at once, and what needs
   no peers is checked here (which all-reduces run, when, asynchronous or not, waited for or not; the bucket
   plan; which tensors are broadcast; how often accumulation communicates);
2. on 3, then 2 gloo processes (:data:`WORLD_SIZES`, :mod:`dlo.course.checks.dp_scratch_worker`): the
   gradients must equal DDP's and those of one process on the global batch, and the weights after the
   optimizer step those of one process (so they agree across ranks), within a tolerance set by the dtype (1e-6 in
   fp32, 1e-9 in fp64), in every set-up of :data:`dlo.course.dp_scratch_cases.SETUPS` (seeds, fp32 and fp64, a
   frozen layer, model widths, 2 to 4 micro-batches, bucket sizes that split the model or not); every step is checked in the same run, cached per script
   content, so the five checks of an unchanged file cost one launch per world size.

A failure says what is wrong in one line, naming the mistake when it is a known one (see the cases module).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

from dlo.course.checks.ddp import one_process_group
from dlo.course.checks.framework import CheckFailed, expect, register, peer_records
from dlo.course.dp_scratch_cases import SETUPS, run_case

SCRIPT = "Jour2/dp_scratch_train.py"
WORKER = Path(__file__).with_name("dp_scratch_worker.py")
WORLD_SIZES = (3, 2)  # 3 first: an odd world size also shows a division by a hard-coded 2
NPROC = WORLD_SIZES[0]
_CACHE: dict[str, dict] = {}


# ----------------------------------------------------------------------------------------------------
# The checkers
# ----------------------------------------------------------------------------------------------------
def _script_of(obj: Any) -> Path:
    fn = obj
    if isinstance(obj, type):
        fn = next((v for v in vars(obj).values() if callable(v) and hasattr(v, "__code__")), None)
    code = getattr(fn, "__code__", None)
    path = Path(code.co_filename) if code else Path("?")
    expect(path.suffix == ".py" and path.is_file(),
           f"the steps must be defined in a script file (dp_scratch_train.py) so that {NPROC} processes can import it")
    return path


def peer_results(script: Path, nproc: int = NPROC, timeout_s: float = 600) -> dict[str, dict]:
    """Every step checked on ``nproc`` gloo processes: ``{step: {"verdict": ..., "diffs": {rank: ...}}}``
    (cached per script content and ``nproc``). The verdict is the first failing rank's."""
    key = f"{script}:{hashlib.sha256(script.read_bytes()).hexdigest()}:{nproc}"
    if key not in _CACHE:
        records = peer_records(WORKER, [str(script)], nproc, timeout_s=timeout_s)
        merged: dict[str, dict] = {}
        for r in sorted(records, key=lambda r: r["rank"]):
            for step, res in r["results"].items():
                entry = merged.setdefault(step, {"verdict": "ok", "diffs": {}})
                if res["verdict"] != "ok" and entry["verdict"] == "ok":
                    entry["verdict"] = f"rank {r['rank']}: {res['verdict']}"
                entry["diffs"][r["rank"]] = res["diffs"]
        for old in [k for k in _CACHE if not k.startswith(key.rsplit(":", 1)[0] + ":")]:
            del _CACHE[old]  # keep the other world size of the same script
        _CACHE[key] = merged
    return _CACHE[key]


def _check(step: str, ns: dict, anchor: Any) -> None:
    """In this process first (a group of one), then on each of WORLD_SIZES processes."""
    try:
        with one_process_group():
            local = run_case(step, ns)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 -- the student's code raised: say so in one line
        raise CheckFailed(f"your code raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]} "
                          "(in a process group of one)") from None
    expect(local["verdict"] == "ok", local["verdict"])
    script = _script_of(anchor)
    for nproc in WORLD_SIZES:
        verdict = peer_results(script, nproc).get(step, {"verdict": "no answer from the check run"})["verdict"]
        if "NotImplementedError" in verdict:
            raise NotImplementedError(verdict.split("NotImplementedError:", 1)[-1].strip())
        expect(verdict == "ok", f"on {nproc} processes: {verdict}")


@register("dp_scratch", "naive", ("allreduce_gradients",), SCRIPT)
def _check_naive(allreduce_gradients: Callable) -> str:
    _check("naive", {"allreduce_gradients": allreduce_gradients}, allreduce_gradients)
    return ("the gradients equal DDP's and one process's on the global batch, and so do the weights after the step "
            f"(2 and 3 processes, {len(SETUPS)} set-ups: fp32 within 1e-6, fp64 within 1e-9, a frozen layer, widths)")


@register("dp_scratch", "broadcast", ("broadcast_state",), SCRIPT)
def _check_broadcast(broadcast_state: Callable) -> str:
    _check("broadcast", {"broadcast_state": broadcast_state}, broadcast_state)
    return (f"every parameter and buffer is rank 0's on 2 and 3 processes, as after DDP's construction ({len(SETUPS)} "
            "set-ups)")


@register("dp_scratch", "overlap", ("OverlappedGradSync",), SCRIPT)
def _check_overlap(cls: type) -> str:
    _check("overlap", {"OverlappedGradSync": cls}, cls)
    return ("one asynchronous all-reduce per trained parameter, launched during backward and waited for once "
            "backward has moved on; gradients and weights equal one process's over two steps (2 and 3 processes, "
            f"{len(SETUPS)} set-ups)")


@register("dp_scratch", "buckets", ("plan_buckets", "BucketedGradSync"), SCRIPT)
def _check_buckets(plan_buckets: Callable, cls: type) -> str:
    _check("buckets", {"plan_buckets": plan_buckets, "BucketedGradSync": cls}, cls)
    return ("DDP's bucket plan (generated vectors and matrices of 2-, 4- and 8-byte elements, caps on and off a "
            "bucket's edge); one asynchronous all-reduce per bucket during backward, the partial one included, waited "
            "for after; gradients and weights equal one process's (2 and 3 processes, caps that split the model and "
            "one that does not)")


@register("dp_scratch", "no_sync", ("GradSync", "train_step_accumulated"), SCRIPT)
def _check_no_sync(base: type, train_step_accumulated: Callable) -> str:
    _check("no_sync", {"GradSync": base, "train_step_accumulated": train_step_accumulated}, train_step_accumulated)
    return ("one all-reduce per parameter for 2 to 4 micro-batches, the step after they are averaged, weights equal "
            "to one step on the global batch over two steps, the mean loss returned; also under DDP's no_sync "
            "(2 and 3 processes)")
