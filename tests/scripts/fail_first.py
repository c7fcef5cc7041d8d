"""Worker for tests/test_launcher.py: one rank fails while the others wait for it in a collective.

``--how raise|kill|exit``: the failing rank raises ValueError("boom"), SIGKILLs itself or calls ``os._exit(3)``;
``--pattern context|bare``: the script uses ``with distributed() as ctx:`` (the documented pattern, whose exit
destroys the process group while the exception is on its way out) or a bare ``init_distributed()``;
``--rank R``: which rank fails (default 1). The other ranks then fail too ("Connection closed by peer") or are
stopped by the launcher; the launcher must blame the failing rank, with its own last line.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.runtime import distributed, init_distributed

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=["raise", "kill", "exit"], default="raise")
parser.add_argument("--pattern", choices=["context", "bare"], default="context")
parser.add_argument("--rank", type=int, default=1)
args = parser.parse_args()


def work(rank: int) -> None:
    dist.all_reduce(torch.ones(1))  # every rank is up and connected
    if rank == args.rank:
        print(f"rank {rank} fails now ({args.how})", flush=True)
        time.sleep(0.3)
        if args.how == "raise":
            raise ValueError("boom")
        if args.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    dist.all_reduce(torch.ones(1))  # never completes: the failing rank is gone


if args.pattern == "context":
    with distributed(timeout_s=60) as ctx:
        work(ctx.rank)
else:
    work(init_distributed(timeout_s=60).rank)
