"""Worker started by the ``ddp`` checkers: each rank imports the student's script and calls one function.

Usage (through dlo.runtime.launch.launch): ``ddp_worker.py SCRIPT FUNCTION``. Writes one record per rank:
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
        # loss sums that float32 cannot hold exactly (5.1, 40.3): totals reduced in float32 lose digits
        loss_sum, correct, count = [(5.1, 4, 10), (40.3, 27, 30)][ctx.rank]
        result = fn(torch.tensor(loss_sum, dtype=torch.float64), torch.tensor(correct), torch.tensor(count))
        result = {k: float(v) for k, v in dict(result).items()}
    elif function == "save_on_main":
        # dist.barrier is replaced by a recorder that does not communicate: a barrier called on some ranks
        # only would hang a real run; here every rank reports its calls and the checker compares them.
        from pathlib import Path

        import torch.distributed as dist
        from torch import nn

        path = Path(sys.argv[3]) / "ckpt.pt"
        dist.barrier = lambda *a, **k: barriers.append(path.is_file())  # type: ignore[assignment]
        dist.monitored_barrier = dist.barrier  # type: ignore[assignment]
        model = nn.Linear(3, 2)
        out = fn(ctx, path, model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
        result = {"barriers": barriers, "returned": None if out is None else str(out), "exists": path.is_file()}
    else:
        raise ValueError(f"no multi-process check for {function!r}")
    write_record({"result": result})
except Exception as exc:  # noqa: BLE001 - reported to the checker
    write_record({"error": f"{type(exc).__name__}: {exc}"})
finally:
    teardown()
