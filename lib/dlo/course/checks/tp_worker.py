"""Worker started by the ``tp`` checkers: 4 gloo processes import the student's tp_balises.py and check every
balise that needs real peers, in one run (process start-up is the expensive part).

Usage (through dlo.runtime.launch.launch, nproc=4): ``tp_worker.py SCRIPT``. The worker builds its own TP
groups {0,1} {2,3} and DP groups {0,2} {1,3} with ``dist.new_group`` so that balises 1-8 are checked at
tp = 2 whatever balises 9-10 do; any collective that ignores its group (sums over 4 ranks instead of 2)
shows up as a wrong number. Balise 12 (sequence parallelism, rank-dependent chunks) is also checked on a
group of 3 ranks {0, 1, 2} (rank 3 only joins the verdicts), so that a chunk order or a split that only works
for 2 ranks shows. The checks themselves are in :mod:`dlo.course.tp_cases` (one module per group of balises).
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
from dlo.course.tp_cases.layers import check_1, check_2, check_3, check_4, check_5, check_6, check_7, check_8
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
        groups = {}
        for ranks in ([0, 1], [2, 3]):
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups["tp_group"] = grp
        for ranks in ([0, 2], [1, 3]):
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups["dp_group"] = grp
        groups.update(tp_rank=rank % 2, dp_rank=rank // 2)
        grp = dist.new_group([0, 1, 2])  # balise 12 at tp = 3
        groups.update(tp3_group=grp if rank < 3 else None, tp3_rank=rank if rank < 3 else None)
        for n in range(1, 13):
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
