"""Worker started by the ``tp`` checkers: 4 gloo processes import the student's tp_balises.py and check the balises
that need real peers.

Usage (through dlo.runtime.launch.launch, nproc=4): ``tp_worker.py SCRIPT [N ...]``: the balises N (1..12) to check,
every one when none is given. A checker asks for its own balise only: the groups cost a tenth of a second, the twelve
checks together about 2.5 s on 2 cores, and a student's script changes between two checks anyway.
The worker builds its own groups with ``dist.new_group`` so that balises 1-8 are checked whatever balises 9-10 do: TP groups {0, 2} {1, 3} (strided, so
that the rank in the group is neither the rank in the world nor the world rank modulo tp) and DP groups {0, 1}
{2, 3} of a 2 x 2 TP x DP layout, an explicit group of the 4 processes (tp = 4), the subset {0, 2, 3} (tp = 3;
rank 1 meanwhile runs the same case alone) and a group of one per process (tp = 1). Any collective that ignores its
group (sums over 4 ranks instead of 2) shows up as a wrong number at tp = 2, which every check tries first. The
cases (which setting, dtype and sizes) are drawn in :mod:`dlo.course.tp_cases.draw`; the checks themselves are in
:mod:`dlo.course.tp_cases` (one module per group of balises).
Each rank writes one record ``{"results": {"1": "ok" | "Type: message", ...}}``.
"""
import sys
import traceback

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.course.exercises import load_exercises
from dlo.course.tp_cases import Bad, expect, fail_together
from dlo.course.tp_cases.groups import check_9, check_10, check_11
from dlo.course.tp_cases.layers import check_1, check_2, check_3, check_4
from dlo.course.tp_cases.models import check_5, check_6, check_7, check_8
from dlo.course.tp_cases.sequence import check_12
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record

CHECKS = {1: check_1, 2: check_2, 3: check_3, 4: check_4, 5: check_5, 6: check_6, 7: check_7, 8: check_8, 9: check_9,
          10: check_10, 11: check_11, 12: check_12}


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = init_distributed(backend="gloo", device="cpu", timeout_s=60)
    results = {}
    try:
        ns = load_exercises(sys.argv[1])
        rank = dist.get_rank()
        groups = {"rank": rank}
        for ranks in ([0, 2], [1, 3]):  # TP: strided
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups.update(tp_group=grp, tp_members=ranks)
        for ranks in ([0, 1], [2, 3]):  # DP: the ranks that hold the same TP slice
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups["dp_group"] = grp
        groups.update(tp_rank=rank // 2, dp_rank=rank % 2, tp4_group=dist.new_group([0, 1, 2, 3]))
        grp = dist.new_group([0, 2, 3])  # tp = 3 on a subset (rank 1 outside it)
        groups.update(tp3_group=grp if rank != 1 else None, tp3_rank={0: 0, 2: 1, 3: 2}.get(rank))
        for k in range(4):  # tp = 1: a group of one process each
            grp = dist.new_group([k])
            if k == rank:
                groups["tp1_group"] = grp
        for n in [int(a) for a in sys.argv[2:]] or range(1, 13):
            try:
                CHECKS[n](ns, groups)
                expect(True, "another rank failed this check")  # every rank leaves the check together
                results[str(n)] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the checker
                if not isinstance(exc, Bad):
                    fail_together()
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                results[str(n)] = line if not isinstance(exc, Bad) else f"Bad: {exc}"
        write_record({"results": results})
    finally:
        teardown()
