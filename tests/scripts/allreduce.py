"""Worker for tests/test_launcher.py: every rank contributes rank + 1, all-reduce sums them.

Run alone (``python allreduce.py``) it is a world of one and the sum is 1.
"""
import sys

import torch
import torch.distributed as dist

import dlo  # noqa: F401  (project caches; must come before any torchvision import)
from dlo.runtime import init_distributed, teardown, write_record

ctx = init_distributed()
value = torch.tensor([ctx.rank + 1.0])
if ctx.is_distributed:
    dist.all_reduce(value)
print(f"hello from rank {ctx.rank} of {ctx.world_size} ({ctx.source}): sum={value.item():g}")
print(f"a line on stderr from rank {ctx.rank}", file=sys.stderr)
write_record({"sum": value.item(), "source": ctx.source, "backend": dist.get_backend() if ctx.is_distributed else None})
teardown()
