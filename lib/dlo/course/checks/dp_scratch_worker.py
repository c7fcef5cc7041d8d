"""Worker started by the ``dp_scratch`` checkers: each gloo process imports the student's dp_scratch_train.py
and runs the case of every step (:func:`dlo.course.dp_scratch_cases.run_case`), in one launch. It imports
no other course's checkers (starting fast matters: every wrong answer checked is one launch).

Usage (through dlo.runtime.launch.launch): ``dp_scratch_worker.py SCRIPT [STEP ...]``. Each rank writes one
record ``{"results": {step: {"verdict": "ok" | message, "diffs": {...}}}}``; an exception (an unfinished step
included) is reported as ``"Type: message"``, not raised, so that the other steps are still checked.
"""
import sys

import torch.distributed as dist

import dlo  # noqa: F401
from dlo.course.dp_scratch_cases import STEPS, load_script, run_case
from dlo.runtime.distributed import exit_after_success, init_distributed, teardown
from dlo.runtime.records import write_record

script, steps = sys.argv[1], sys.argv[2:] or list(STEPS)
# gloo on CPU tensors even on a GPU node: the check is about the arithmetic, not the transport. The timeout
# bounds a collective that some ranks never join (a wrong answer), instead of waiting for the launch's.
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)
results = {}
try:
    ns = load_script(script)
    for step in steps:
        try:
            results[step] = run_case(step, ns)
        except Exception as exc:  # noqa: BLE001 - reported to the checker
            results[step] = {"verdict": f"{type(exc).__name__}: {exc}", "diffs": {}}
    write_record({"results": results})
    dist.barrier()  # every rank is done with every collective
except BaseException:
    teardown()
    raise
exit_after_success(keep_group=True)  # answered; past the barrier no peer waits for this rank
