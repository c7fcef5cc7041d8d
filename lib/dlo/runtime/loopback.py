"""The servers of a run on one machine listen on 127.0.0.1 only: nothing else on the network can reach them.

Why: a distributed run starts servers. Rank 0 (or torchrun's agent) hosts a ``TCPStore`` where the ranks meet,
and gloo and NCCL open sockets for their data. PyTorch binds the store to every interface (``:::PORT``) whatever
``MASTER_ADDR`` says, and the store has no authentication: on a shared machine (a lab's JupyterHub, a login
node) anyone who can reach the port can read and write what the ranks exchange, or stop the run. The ranks of a
run on one machine never need more than the loopback interface, so:

* the store's listening socket is made here, bound to ``127.0.0.1``, and handed to PyTorch
  (``TCPStore(master_listen_fd=...)``, libuv backend): the fork launcher hosts it in the launching process and
  the ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``); under torchrun, ``python -m
  dlo.runtime.loopback`` runs torchrun with every store its agent creates bound this way (its rendezvous store
  and the store it shares with the ranks);
* gloo and NCCL are told to use the loopback interface (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``; values
  you set yourself are kept).

A run over several nodes (srun under Slurm) is different: the other nodes must reach rank 0's store and every
rank's gloo/NCCL sockets, so those bind what PyTorch binds (every interface of the node, inside the cluster's
private network); nothing here applies to it.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import MutableMapping, Sequence
from typing import Any

LOOPBACK = "127.0.0.1"

#: The TCPStore constructor's parameters in order (torch 2.11 and 2.13), to read positional arguments by name.
_STORE_PARAMS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
                 "master_listen_fd", "use_libuv")


def loopback_interface() -> str:
    """The name of the loopback network interface ("lo" on Linux, "lo0" on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):  # pragma: no cover - platforms without if_nameindex
        names = []
    return next((name for name in names if name.startswith("lo")), "lo")


def loopback_network(env: MutableMapping[str, str], *, nccl: bool = True) -> MutableMapping[str, str]:
    """Point gloo (and NCCL) at the loopback interface in ``env``, unless the variable is already set there."""
    lo = loopback_interface()
    env.setdefault("GLOO_SOCKET_IFNAME", lo)
    if nccl:
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    return env


def listening_socket(port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` (0: a free port the kernel picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


def _store_kwargs(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    if len(args) > len(_STORE_PARAMS):
        raise TypeError(f"TCPStore takes at most {len(_STORE_PARAMS)} arguments, got {len(args)}")
    return {**dict(zip(_STORE_PARAMS, args)), **kwargs}


def _loopback_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """A master store's arguments with a listening socket bound to 127.0.0.1 (its port, if 0, then the one
    the kernel picked); a client's, or a master given its own socket, unchanged."""
    if not kw.get("is_master") or kw.get("master_listen_fd") is not None:
        return kw
    sock = listening_socket(int(kw.get("port") or 0))
    port = sock.getsockname()[1]
    return {**kw, "port": port, "master_listen_fd": sock.detach(), "use_libuv": True}


def loopback_store(port: int = 0, *, timeout_s: float = 300) -> Any:
    """A master ``TCPStore`` that listens on 127.0.0.1:``port`` only (``store.port`` says which port)."""
    import torch.distributed as dist

    kw = _loopback_kwargs({"host_name": LOOPBACK, "port": port, "is_master": True, "wait_for_workers": False,
                           "timeout": datetime.timedelta(seconds=timeout_s), "multi_tenant": False})
    return dist.TCPStore(**kw)


def _loopback_store_class() -> type:
    import torch.distributed as dist

    base = dist.TCPStore

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        """``TCPStore`` whose master listens on 127.0.0.1 only."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(**_loopback_kwargs(_store_kwargs(args, kwargs)))

    return LoopbackTCPStore


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dlo.runtime.loopback <torchrun arguments>``: torchrun, with its stores on 127.0.0.1 only."""
    import torch.distributed as dist

    # this process is torchrun's agent, not a rank: its own failure ("a rank failed") is no rank's failure note
    sys.excepthook = sys.__excepthook__
    loopback = _loopback_store_class()
    dist.TCPStore = loopback  # looked up when the agent creates the store it shares with its ranks
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    c10d_rendezvous_backend.TCPStore = loopback  # the rendezvous store (imported by name there)

    run.main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    main()
