"""Worker of the ``experts dispatch`` checker: each gloo process runs the student's ``dispatch_combine`` (from the
source text the checker wrote) on the cases of :data:`dlo.course.dispatch_cases.CASES` and records one
verdict per case. A collective that a peer never joins fails after the group's short timeout instead of hanging.

Usage (through dlo.runtime.launch.launch_forked): ``experts_dispatch_worker.py ANSWER`` (``.py``: source text;
``.code``: the function's compiled code, see :func:`dlo.course.checks.experts_dispatch.write_answer`).
"""
import marshal
import math
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.dispatch_cases import CASES, case_inputs, checked_all_to_all, verdict
from dlo.parallel import experts as X
from dlo.runtime.distributed import exit_after_success, init_distributed, teardown
from dlo.runtime.records import write_record

ctx = init_distributed(backend="gloo", device="cpu", timeout_s=30)
# split sizes compared across the ranks before each exchange: a mismatch is named on every rank, not a crash
dist.all_to_all_single = checked_all_to_all(dist.all_to_all_single)
try:
    ns = {"__name__": "__exercises__", "torch": torch, "dist": dist, "F": F, "nn": nn, "math": math, "X": X}
    path = sys.argv[1]
    if path.endswith(".code"):  # the function's compiled code, written by the checker (same interpreter)
        with open(path, "rb") as f:
            code, defaults = marshal.loads(f.read())
        ns["dispatch_combine"] = types.FunctionType(code, ns, "dispatch_combine", defaults)
    else:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)  # noqa: S102 - the student's answer, checked
    results = []
    for case, (where, _, _) in enumerate(CASES):
        rows, expert = case_inputs(case, ctx.rank)
        try:
            results.append(verdict(ns["dispatch_combine"], rows, expert, ctx.rank, ctx.world_size, where))
        except Exception as exc:  # noqa: BLE001 - reported to the checker
            results.append(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            break  # the group may be out of step now
    write_record({"verdicts": results})
    dist.barrier()
except BaseException:
    teardown()
    raise
exit_after_success(keep_group=True)
