"""Worker of the ``experts dispatch`` checker: each gloo process runs the student's ``dispatch_combine`` (from the
source text the checker wrote) on the cases of :data:`dlo.course.dispatch_cases.CASES` (the default group of 3
processes, and explicit groups of 2 that are not the world) and records one verdict per case it takes part in. A
collective that a peer never joins fails after the group's short timeout instead of hanging; after a case that
failed on any rank, every rank stops.

Usage (through dlo.runtime.launch.launch_forked): ``experts_dispatch_worker.py ANSWER`` (``.py``: source text;
``.code``: the function's compiled code, see :func:`dlo.course.exercises.write_answer`).
"""
import math
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.dispatch_cases import CASES, CheckedAllToAll, case_inputs, split_sizes, verdict
from dlo.parallel import experts as X
from dlo.runtime.distributed import exit_after_success, init_distributed, teardown
from dlo.course.exercises import read_answer
from dlo.runtime.records import write_record

ctx = init_distributed(backend="gloo", device="cpu", timeout_s=30)
# split sizes compared across the group (and with the case's) before each exchange: a mistake is named on every
# rank, not a crash
checked = CheckedAllToAll(dist.all_to_all_single)
dist.all_to_all_single = checked
try:
    ns = {"__name__": "__exercises__", "torch": torch, "dist": dist, "F": F, "nn": nn, "math": math, "X": X}
    read_answer(sys.argv[1], ns, "dispatch_combine")
    groups = {m: dist.new_group(list(m)) for m in dict.fromkeys(c.members for c in CASES if c.members is not None)}
    results = []
    for number, case in enumerate(CASES):
        members = case.members if case.members is not None else tuple(range(ctx.world_size))
        failed = 0
        if ctx.rank in members:
            rank = members.index(ctx.rank)
            where = f"case {number + 1} of {len(CASES)} ({case.describe()})"
            group = groups.get(case.members)
            checked.start(group, split_sizes(case, rank))
            rows, expert = case_inputs(case, rank)
            try:
                results.append(verdict(ns["dispatch_combine"], rows, expert, rank, case.ep, where, case.num_experts,
                                       group))
            except Exception as exc:  # noqa: BLE001 - reported to the checker
                results.append(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            failed = int(results[-1] != "ok")
        flag = torch.tensor([failed])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the groups may be out of step after a failure: stop together
        if int(flag):
            break
    write_record({"verdicts": results})
    dist.barrier()
except BaseException:
    teardown()
    raise
exit_after_success(keep_group=True)
