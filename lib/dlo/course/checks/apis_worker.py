"""Worker of the ``apis fabric_port`` checker: each of 2 gloo processes trains the student's ``fabric_loop`` (from
the source text the checker wrote) and the reference loop on a 2-process DDP Fabric, and records for each what the
rank did: the sample ids of every batch it iterated, the micro-batches after which the gradients were all-reduced
(seen by a DDP communication hook, the effect of ``no_backward_sync``), the losses returned and the final weights.

Usage (through dlo.runtime.launch.launch_forked): ``apis_worker.py ANSWER`` (``.py``: source text; ``.code``: the
function's compiled code, see :func:`dlo.course.exercises.write_answer`).
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from dlo.course.checks.apis import PEER_SETUPS, logged_setup, reference_loop
from dlo.runtime.distributed import exit_after_success, init_distributed, teardown
from dlo.course.exercises import read_answer
from dlo.runtime.records import write_record

ctx = init_distributed(backend="gloo", device="cpu", timeout_s=60)


def _fabric(log):
    """A 2-process CPU DDP Fabric whose DDP modules report each all-reduce of the gradients to ``log``."""
    from lightning_fabric import Fabric
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    def hooked(module):
        for m in module.modules() if isinstance(module, nn.Module) else ():
            if isinstance(m, DistributedDataParallel) and not getattr(m, "_dlo_hooked", False):
                m._dlo_hooked = True

                def hook(state, bucket):
                    log.synced.add(len(log.batches) - 1)
                    return allreduce_hook(state, bucket)

                m.register_comm_hook(None, hook)
        return module

    class PeerFabric(Fabric):
        def setup(self, module, *optimizers, **kwargs):
            out = super().setup(module, *optimizers, **kwargs)
            hooked(out[0] if isinstance(out, (tuple, list)) else out)
            return out

        def setup_module(self, module, *args, **kwargs):
            return hooked(super().setup_module(module, *args, **kwargs))

    fabric = PeerFabric(accelerator="cpu", devices=ctx.world_size, strategy="ddp", precision="32-true")
    fabric.launch()
    return fabric


def _train(loop, setup) -> dict:
    seed, accumulate, steps, batch, samples = setup
    model, optimizer, loader, log = logged_setup(seed, batch, samples)
    try:
        losses = loop(_fabric(log), model, optimizer, loader, accumulate, steps)
        losses = [float(v) for v in losses]
    except Exception as exc:  # noqa: BLE001 - reported to the checker
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
    return {"batches": log.batches, "synced": sorted(log.synced), "losses": losses,
            "weights": [p.detach().reshape(-1).tolist() for p in model.parameters()]}


try:
    ns = {"__name__": "__exercises__", "torch": torch, "F": F, "nn": nn, "DataLoader": DataLoader}
    read_answer(sys.argv[1], ns, "fabric_loop")
    runs = []
    for setup in PEER_SETUPS:
        runs.append({"answer": _train(ns["fabric_loop"], setup), "reference": _train(reference_loop, setup)})
        dist.barrier()
        if "error" in runs[-1]["answer"]:
            break  # the group may be out of step now
    write_record({"runs": runs})
    dist.barrier()
except BaseException:
    teardown()
    raise
exit_after_success(keep_group=True)
