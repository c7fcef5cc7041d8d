"""Two ranks that meet, then report every TCP socket listening in the launch's process tree (rank 0 only)."""
import os

import psutil
import torch
import torch.distributed as dist

from dlo.runtime import distributed, write_record

with distributed(device="cpu") as ctx:
    t = torch.ones(1)
    dist.all_reduce(t)  # every store and gloo socket of the run exists by now
    if ctx.rank == 0:
        # the launching process (the fork launcher's store), this rank's parent (torchrun's agent, or the fork
        # server) and every rank (gloo's sockets)
        parent = psutil.Process().parent()
        procs = [psutil.Process(int(os.environ["DLO_TEST_LAUNCHER_PID"])), parent, *parent.children()]
        seen = []
        for proc in procs:
            try:
                conns = proc.net_connections("tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen += [[c.laddr.ip, c.laddr.port, proc.pid] for c in conns if c.status == psutil.CONN_LISTEN]
        write_record({"listening": seen, "processes": len(procs), "sum": t.item()})
    dist.barrier()
