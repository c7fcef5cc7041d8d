"""Worker for tests/test_launcher.py: what a forked rank finds when its first line runs.

It records which of torch, torch.distributed and torch._dynamo were already imported (preloaded by the server it
was forked from: an optimizer's construction imports torch._dynamo, seconds in every rank otherwise), its thread
count, the arguments it was given, and the caller's variables it should (not) see; rank 1 exits with the
code given as ``--exit-code`` after writing its record.
"""
import os
import sys

# before this script imports anything
preloaded = sorted(m for m in ("torch", "torch.distributed", "torch._dynamo") if m in sys.modules)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dlo  # noqa: E402,F401
from dlo.runtime import init_distributed, teardown, write_record  # noqa: E402

ctx = init_distributed(backend="gloo", device="cpu", timeout_s=60)
value = torch.tensor([ctx.rank + 1.0])
dist.all_reduce(value)
exit_code = int(sys.argv[sys.argv.index("--exit-code") + 1]) if "--exit-code" in sys.argv else 0
write_record({"sum": value.item(), "preloaded": preloaded, "threads": torch.get_num_threads(),
              "argv": sys.argv[1:], "probe": os.environ.get("DLO_PROBE"), "main": __name__})
teardown()
if ctx.rank == 1 and exit_code:
    sys.exit(exit_code)
