"""Worker for tests/test_launcher.py: rank 1 raises while rank 0 waits for it in a collective.

Rank 0 then fails too ("Connection closed by peer") or is stopped by the launcher; the launcher must
still blame rank 1, the one that failed first.
"""
import time

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.runtime import init_distributed

ctx = init_distributed(timeout_s=60)
print(f"rank {ctx.rank} ready")
if ctx.rank == 1:
    time.sleep(0.5)
    raise ValueError("boom")
dist.all_reduce(torch.ones(1))  # never completes: rank 1 is gone
