"""Worker started by the ``ddp`` checkers: each rank imports the student's script and calls one function.

Usage (through dlo.runtime.launch.launch): ``ddp_worker.py SCRIPT FUNCTION ARG``: for ``reduce_metrics`` ARG is the
cases as JSON (per case, each rank's loss sum, correct and count), for ``save_on_main`` a folder to write in. Writes one record per rank:
``{"result": ...}`` or ``{"error": "ExceptionType: message"}`` (an exception is reported, not raised, so
that an unfinished exercise reads as "not implemented yet" rather than as a crashed run).
"""
import sys

import torch

import dlo  # noqa: F401
from dlo.course.exercises import load_exercises
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record

script, function = sys.argv[1], sys.argv[2]
barriers: list[bool] = []  # save_on_main: one entry per dist.barrier() call: did the checkpoint exist then?
# gloo on CPU tensors even on a GPU node: the check is about the arithmetic, not the transport;
# a peer that dies makes torchrun stop the other; the timeout only bounds a peer that hangs
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=300)
try:
    fn = load_exercises(script)[function]
    if function == "reduce_metrics":
        import json

        result = []
        for rows in json.loads(sys.argv[3]):  # every case in this one launch, in the same order on every rank
            loss_sum, correct, count = rows[ctx.rank]
            out = fn(torch.tensor(loss_sum, dtype=torch.float64), torch.tensor(correct), torch.tensor(count))
            result.append({k: float(v) for k, v in dict(out).items() if k in ("loss", "accuracy")})
    elif function == "save_on_main":
        # dist.barrier is replaced by a recorder that does not communicate: a barrier called on some ranks
        # only would hang a real run; here every rank reports its calls and the checker compares them.
        from pathlib import Path

        import torch.distributed as dist
        from torch import nn

        from torch.nn.parallel import DistributedDataParallel as DDP

        path = Path(sys.argv[3]) / "ckpt.pt"
        torch.manual_seed(ctx.world_size)  # the checker rebuilds these weights to compare with the saved ones
        model = DDP(nn.Linear(3, ctx.world_size))
        real_barrier = dist.barrier
        real_barrier()  # DDP's construction done everywhere before the recorder replaces the barrier
        dist.barrier = lambda *a, **k: barriers.append(path.is_file())  # type: ignore[assignment]
        dist.monitored_barrier = dist.barrier  # type: ignore[assignment]
        out = fn(ctx, path, model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
        result = {"barriers": barriers, "returned": None if out is None else str(out), "exists": path.is_file()}
    else:
        raise ValueError(f"no multi-process check for {function!r}")
    write_record({"result": result})
except Exception as exc:  # noqa: BLE001 - reported to the checker
    write_record({"error": f"{type(exc).__name__}: {exc}"})
finally:
    teardown()
