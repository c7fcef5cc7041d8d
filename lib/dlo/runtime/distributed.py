"""The distributed context: who am I (rank), how many are we, where do we meet -- read from torchrun or
Slurm -- and the process group made from it (gloo on CPU, nccl on GPU).
"""
from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from typing import Any

import torch


from dlo.runtime.device import pick_device
from dlo.runtime.context import DistContext, dist_context
from dlo.runtime.loopback import loopback_network
from dlo.runtime.records import _install_failure_hook, note_failure



# ----------------------------------------------------------------------------------------------------
# Process group
# ----------------------------------------------------------------------------------------------------
def _cuda_index(ctx: DistContext, dev: torch.device) -> int:
    """Which visible GPU this process should own.

    Usually ``local_rank``. When exactly one GPU is visible, Slurm (``--gpus-per-task=1``, GPU binding)
    already gave each task its own GPU and renumbered it 0, so index 0 is right for every task.
    """
    if dev.index is not None:
        return dev.index
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    if ctx.local_rank >= count:
        raise ValueError(
            f"local rank {ctx.local_rank} has no GPU of its own: only {count} are visible on this node; "
            f"start at most {count} processes per node"
        )
    return ctx.local_rank


def _loopback_only(backend: str) -> None:
    """Make the backend of a group of one listen on 127.0.0.1 only.

    gloo (and NCCL's bootstrap) otherwise listen on the address of the machine's host name, reachable from
    the whole network, for a group that no other process will ever join. ``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` name the interface to use; one you set yourself is kept.
    """
    loopback_network(os.environ, nccl=backend == "nccl")


def init_distributed(backend: str | None = None, device: str | None = None, timeout_s: float = 600,
                     group_of_one: bool = False) -> DistContext:
    """Join the process group described by :func:`dist_context` and return that context.

    * ``backend`` defaults to ``"nccl"`` when the device (see :func:`pick_device`) is a GPU, ``"gloo"``
      otherwise: NCCL moves CUDA tensors GPU-to-GPU, gloo handles CPU tensors.
    * On GPU it first calls ``torch.cuda.set_device`` so that ``"cuda"`` means *this process's* GPU;
      forgetting this puts every rank on GPU 0.
    * Under Slurm it exports ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
      ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` so that ``init_method="env://"`` (and any library reading
      them) sees what torchrun would have set.
    * A single process (world size 1) creates no process group at all: the same script then runs
      unchanged with plain ``python script.py``; guard collectives with ``ctx.is_distributed``. With
      ``group_of_one=True`` it creates a group of one process instead, for the libraries that need a group
      even alone (FSDP2, torch.distributed.checkpoint, DeepSpeed, which also reads ``LOCAL_RANK``: set to 0
      unless already set); ``ctx.is_distributed`` stays False. That group listens on no network: its store
      is in memory and its backend is bound to the loopback interface (127.0.0.1).
    * Calling it again once initialised just returns the context.

    ``timeout_s`` bounds how long collectives (and the initial rendezvous) wait for a missing peer.
    """
    import torch.distributed as dist

    if timeout_s is None or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    ctx = dist_context()
    _install_failure_hook()
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed support: install a standard torch wheel")
    if dist.is_initialized():
        return ctx

    dev = pick_device(device)
    backend = (backend or ("nccl" if dev.type == "cuda" else "gloo")).lower()
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError("backend 'nccl' only moves CUDA tensors but the device is the CPU: use backend='gloo'")
    if backend in ("nccl", "gloo", "mpi") and not getattr(dist, f"is_{backend}_available")():
        raise ValueError(f"backend {backend!r} is not available in this PyTorch build: use backend='gloo'")

    device_id = None
    if dev.type == "cuda":
        index = _cuda_index(ctx, dev)
        torch.cuda.set_device(index)
        device_id = torch.device("cuda", index)
    if not ctx.is_distributed:
        if group_of_one:
            os.environ.setdefault("LOCAL_RANK", "0")
            _loopback_only(backend)
            # An in-memory store: one process has nobody to meet, so no TCP server listens for a rendezvous.
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        return ctx

    if ctx.source == "slurm":
        os.environ.update(
            MASTER_ADDR=ctx.master_addr,
            MASTER_PORT=str(ctx.master_port),
            RANK=str(ctx.rank),
            WORLD_SIZE=str(ctx.world_size),
            LOCAL_RANK=str(ctx.local_rank),
            LOCAL_WORLD_SIZE=str(ctx.local_world_size),
            GROUP_RANK=str(ctx.node_rank),
        )
    kwargs: dict[str, Any] = {}
    if device_id is not None and backend == "nccl":
        kwargs["device_id"] = device_id  # binds the communicator to this GPU now, not at the first collective
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    return ctx


def teardown() -> None:
    """Destroy the process group if there is one (no barrier: a crashed peer must not make us hang)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_after_success(code: int = 0, *, keep_group: bool = False) -> None:
    """End a finished rank now: destroy the process group, flush, and leave without Python's finalizers.

    A script whose work is done and whose records are written can still die at exit: DeepSpeed keeps process
    groups and threads in module globals, and the interpreter destroys them in no set order after the default
    group; a rank then aborts ("terminate called without an active exception", SIGABRT) and the launcher reports
    the whole run as failed. Call it last, after a successful ``main()``; an exception must still propagate.

    ``keep_group=True`` leaves without destroying the gloo group either: under heavy load a rank was seen hanging
    inside that destruction after its work was done. Only after a ``dist.barrier()`` that every rank passes once
    its collectives are over: past it, no peer waits for this rank any more."""
    import sys

    if not keep_group:
        teardown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def distributed(backend: str | None = None, device: str | None = None, timeout_s: float = 600) -> Iterator[DistContext]:
    """``with distributed() as ctx:`` = :func:`init_distributed` on entry, :func:`teardown` on exit.

    If a process group already existed on entry, it belongs to someone else and is left alone on exit.
    An exception leaving the block is noted for :func:`launch` (which rank failed, when) *before* the group is
    destroyed: destroying it closes the peers' connections, and they would otherwise fail ("Connection closed by
    peer") and be blamed before this rank's own failure is noted.
    """
    import torch.distributed as dist

    owned = not (dist.is_available() and dist.is_initialized())
    ctx = init_distributed(backend=backend, device=device, timeout_s=timeout_s)
    try:
        yield ctx
    except BaseException as exc:
        if not isinstance(exc, SystemExit):  # sys.exit(n): the exit code says it, as it does without the block
            note_failure(exc)
        raise
    finally:
        if owned:
            teardown()


