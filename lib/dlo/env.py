"""Where am I running, and with whom? Devices, distributed context, records and the launcher.

A distributed PyTorch program is N copies of the same script that must agree on four numbers before they
can talk: *who am I* (``rank``), *how many are we* (``world_size``), *which GPU of this node is mine*
(``local_rank``) and *where do we meet* (``MASTER_ADDR:MASTER_PORT``). Two launchers hand out these
numbers, each in its own environment variables:

* ``torchrun`` (``python -m torch.distributed.run``) starts the N processes itself and sets ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``GROUP_RANK``;
* Slurm's ``srun`` starts the N tasks across the allocated nodes and sets ``SLURM_PROCID``,
  ``SLURM_LOCALID``, ``SLURM_NTASKS`` ... but nothing PyTorch reads directly.

:func:`dist_context` reads either set (torchrun first), :func:`init_distributed` turns it into a process
group, and :func:`launch` starts a script on N processes from a notebook or a test, streaming every
line prefixed with its rank and collecting the JSON records the ranks wrote with :func:`write_record`.

Typical worker script::

    from dlo.env import distributed, write_record
    import torch, torch.distributed as dist

    with distributed() as ctx:          # gloo on CPU, nccl on GPU; no-op when run alone
        t = torch.tensor([ctx.rank + 1.0])
        if ctx.is_distributed:
            dist.all_reduce(t)
        write_record({"sum": t.item()})

and from the notebook: ``records = launch("worker.py", nproc=2)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "pick_device",
    "DistContext",
    "dist_context",
    "expand_nodelist",
    "init_distributed",
    "teardown",
    "distributed",
    "write_record",
    "read_records",
    "LaunchError",
    "build_launch_command",
    "launch",
    "free_port",
    "DEFAULT_MASTER_PORT",
]

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's own default, so single-process and torchrun runs look alike
RECORDS_ENV = "DLO_RECORDS_DIR"
DEVICE_ENV = "DLO_DEVICE"
_FAILURES_SUBDIR = "failures"  # <records_dir>/failures/rank<r>.json, written by the excepthook below
_RECORD_FILE = re.compile(r"^rank(\d+)\.jsonl$")


# ----------------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------------
def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device to compute on: ``"auto"`` (GPU if one is visible, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.

    With ``prefer=None`` the environment variable ``DLO_DEVICE`` decides (so a whole notebook can be
    forced onto the CPU from outside), and ``"auto"`` when it is unset. Asking for a GPU that is not
    there raises instead of quietly falling back to the CPU: a benchmark that silently ran on the CPU
    would teach the wrong lesson.
    """
    from_env = False
    if prefer is None:
        env = os.environ.get(DEVICE_ENV, "").strip()
        from_env = bool(env)
        prefer = env or "auto"
    if isinstance(prefer, torch.device):
        prefer = str(prefer)
    if not isinstance(prefer, str):
        raise ValueError(f"device must be a string like 'auto', 'cpu', 'cuda' or 'cuda:0', not {type(prefer).__name__}")
    where = f" (from ${DEVICE_ENV})" if from_env else ""
    name = prefer.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise ValueError(f"unknown device {prefer!r}{where}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {prefer!r}{where} was requested but no GPU is visible (torch.cuda.is_available() is False): "
            "use device='auto' or 'cpu'"
        )
    if match.group(1) is None:
        return torch.device("cuda")
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise ValueError(
            f"device {prefer!r}{where} does not exist: only {count} GPU(s) are visible, use cuda:0..cuda:{count - 1}"
        )
    return torch.device("cuda", index)


# ----------------------------------------------------------------------------------------------------
# Distributed context: who am I, how many are we, where do we meet
# ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DistContext:
    """The numbers a process needs to join a process group, and where they came from.

    ``rank`` is unique across all processes (0..world_size-1); ``local_rank`` is unique on one node and
    picks that process's GPU; ``node_rank`` numbers the nodes. ``source`` says who set them:
    ``"torchrun"``, ``"slurm"`` (an ``srun`` task) or ``"single"`` (a plain ``python script.py``).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str
    node_rank: int = 0

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one process that should print, plot and save."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when there is more than one process (collectives are needed)."""
        return self.world_size > 1


def _int_var(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or str(raw).strip() == "":
        if default is None:
            raise ValueError(f"environment variable {name} is required here but not set")
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _check(ctx: DistContext) -> DistContext:
    if ctx.world_size < 1:
        raise ValueError(f"world size must be >= 1, got {ctx.world_size} (from {ctx.source} variables)")
    if not 0 <= ctx.rank < ctx.world_size:
        raise ValueError(f"rank {ctx.rank} is outside 0..{ctx.world_size - 1} (from {ctx.source} variables)")
    if ctx.local_world_size < 1 or not 0 <= ctx.local_rank < ctx.local_world_size:
        raise ValueError(
            f"local rank {ctx.local_rank} is outside 0..{ctx.local_world_size - 1} (from {ctx.source} variables)"
        )
    if not 0 < ctx.master_port < 65536:
        raise ValueError(f"master port {ctx.master_port} is not a valid TCP port (from {ctx.source} variables)")
    return ctx


def _expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's tasks-per-node notation: ``"4"``, ``"2(x3)"``, ``"2(x2),1"`` -> one count per node."""
    out: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise ValueError(f"cannot parse Slurm tasks-per-node value {spec!r} (expected e.g. '4' or '2(x3),1')")
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


_SLURM_STEP_MARKERS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST")


def dist_context(environ: Mapping[str, str] | None = None) -> DistContext:
    """Read rank, world size and rendezvous address from torchrun's or Slurm's variables.

    Precedence: torchrun's ``RANK``/``WORLD_SIZE``/... (they are also what ``init_method="env://"``
    reads), then the variables of an ``srun`` task, then a single process (rank 0 of 1). ``environ``
    defaults to ``os.environ``; pass a dict to see what a given environment would give.

    Slurm details worth knowing:

    * Only a task started by ``srun`` counts (a job-step variable such as ``SLURM_STEP_ID`` is set).
      The batch script itself, or a notebook running inside an allocation, also sees ``SLURM_PROCID=0``
      and ``SLURM_NTASKS=4``, but it is one process: treating it as rank 0 of 4 would hang forever
      waiting for three peers that were never started. It is therefore a ``"single"`` context.
    * Step values win over job values (``SLURM_STEP_NUM_TASKS`` over ``SLURM_NTASKS``,
      ``SLURM_STEP_NODELIST`` over ``SLURM_JOB_NODELIST``): an ``srun -n 2`` inside a 4-task job is a
      world of 2.
    * The master is the first host of the step's node list; the port is derived from the job id
      (``20000 + job_id % 20000``) so that every task computes the same one without talking, and two
      jobs sharing a node rarely collide. ``MASTER_ADDR`` / ``MASTER_PORT`` override both.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ

    if "RANK" in env or "WORLD_SIZE" in env:
        rank = _int_var(env, "RANK")
        world = _int_var(env, "WORLD_SIZE")
        local_world = _int_var(env, "LOCAL_WORLD_SIZE", world)  # set by torchrun; one node when set by hand
        if world < 1 or local_world < 1:
            raise ValueError(f"WORLD_SIZE={world} and LOCAL_WORLD_SIZE={local_world} must both be >= 1")
        local_rank = _int_var(env, "LOCAL_RANK", rank % local_world)
        node_rank = _int_var(env, "GROUP_RANK", rank // local_world)
        # init_distributed() exports Slurm's numbers as RANK/WORLD_SIZE for env://; keep calling them Slurm's.
        from_slurm = "TORCHELASTIC_RUN_ID" not in env and env.get("SLURM_PROCID") == str(rank)
        return _check(
            DistContext(
                rank=rank,
                local_rank=local_rank,
                world_size=world,
                local_world_size=local_world,
                master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
                master_port=_int_var(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
                source="slurm" if from_slurm else "torchrun",
                node_rank=node_rank,
            )
        )

    if "SLURM_PROCID" in env and any(k in env for k in _SLURM_STEP_MARKERS):
        rank = _int_var(env, "SLURM_PROCID")
        ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
        if not ntasks:
            raise ValueError("Slurm task without SLURM_STEP_NUM_TASKS or SLURM_NTASKS: launch it with srun --ntasks N")
        world = _int_var({"SLURM_NTASKS": ntasks}, "SLURM_NTASKS")
        node_rank = _int_var(env, "SLURM_NODEID", 0)
        local_rank = _int_var(env, "SLURM_LOCALID", 0)
        per_node_spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE") or env.get(
            "SLURM_TASKS_PER_NODE"
        )
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        hosts = expand_nodelist(nodelist) if nodelist else []
        if per_node_spec:
            per_node = _expand_tasks_per_node(per_node_spec)
            if len(set(per_node)) == 1:  # the usual case: the same number of tasks on every node
                local_world = per_node[0]
            elif node_rank < len(per_node):
                local_world = per_node[node_rank]
            else:
                raise ValueError(
                    f"SLURM_NODEID={node_rank} has no entry in tasks-per-node {per_node_spec!r}: "
                    "launch with srun --ntasks-per-node N"
                )
        elif len(hosts) == 1:
            local_world = world
        else:
            raise ValueError(
                "cannot tell how many Slurm tasks run on this node (SLURM_STEP_TASKS_PER_NODE is not set): "
                "launch with srun --ntasks-per-node N"
            )
        master_addr = env.get("MASTER_ADDR") or (hosts[0] if hosts else None)
        if not master_addr:
            raise ValueError(
                "Slurm task without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: set MASTER_ADDR to the first node"
            )
        if env.get("MASTER_PORT"):
            port = _int_var(env, "MASTER_PORT")
        elif env.get("SLURM_JOB_ID"):
            port = 20000 + _int_var(env, "SLURM_JOB_ID") % 20000
        else:
            port = DEFAULT_MASTER_PORT
        return _check(
            DistContext(
                rank=rank,
                local_rank=local_rank,
                world_size=world,
                local_world_size=local_world,
                master_addr=master_addr,
                master_port=port,
                source="slurm",
                node_rank=node_rank,
            )
        )

    return DistContext(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
        master_port=_int_var(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
        source="single",
        node_rank=0,
    )


def expand_nodelist(s: str) -> list[str]:
    """Expand a Slurm compressed host list, e.g. ``"jean-zay-iam[01-04,07]"`` -> 5 host names.

    Slurm writes node lists compactly (``SLURM_JOB_NODELIST``); ``scontrol show hostnames`` expands
    them, but scontrol is not always on ``PATH`` inside a container. Rules: top-level commas separate
    hosts, commas inside ``[...]`` separate numbers or ranges, ``lo-hi`` keeps the zero padding of
    ``lo`` (``[08-10]`` -> ``08, 09, 10``), several bracket groups give every combination
    (``r[1-2]n[1-2]`` -> 4 hosts), and text may follow a bracket (``gpu[001-002]-ib``).
    """
    if not isinstance(s, str) or not s.strip():
        raise ValueError(f"empty or non-string Slurm node list {s!r}: expected e.g. 'node[01-04]'")
    text = s.strip()

    items, depth, start = [], 0, 0  # split on top-level commas only
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"malformed Slurm node list {s!r}: nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"malformed Slurm node list {s!r}: ']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"malformed Slurm node list {s!r}: '[' is never closed")
    items.append(text[start:])

    hosts: list[str] = []
    for item in items:
        if not item or re.search(r"\s", item):
            raise ValueError(f"malformed Slurm node list {s!r}: empty host name or whitespace in {item!r}")
        parts = re.split(r"(\[[^\]]*\])", item)  # literal, [group], literal, [group], ...
        expansions = [""]
        for part in parts:
            if part.startswith("["):
                choices = _expand_bracket(part[1:-1], s)
            elif "]" in part:
                raise ValueError(f"malformed Slurm node list {s!r}: stray ']' in {item!r}")
            else:
                choices = [part]
            expansions = [prefix + c for prefix in expansions for c in choices]
        hosts += expansions
    return hosts


def _expand_bracket(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if match is None:
            raise ValueError(f"malformed Slurm node list {whole!r}: {piece!r} is not a number or a range like 01-04")
        lo, hi = match.group(1), match.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"malformed Slurm node list {whole!r}: range {piece!r} goes backwards")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


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
      ``group_of_one=True`` it creates a group of one process instead (on a free local port), for the
      libraries that need a group even alone (FSDP2, torch.distributed.checkpoint, DeepSpeed, which also
      reads ``LOCAL_RANK``: set to 0 unless already set); ``ctx.is_distributed`` stays False.
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
            dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                    world_size=1, timeout=datetime.timedelta(seconds=timeout_s))
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


@contextlib.contextmanager
def distributed(backend: str | None = None, device: str | None = None, timeout_s: float = 600) -> Iterator[DistContext]:
    """``with distributed() as ctx:`` = :func:`init_distributed` on entry, :func:`teardown` on exit.

    If a process group already existed on entry, it belongs to someone else and is left alone on exit.
    """
    import torch.distributed as dist

    owned = not (dist.is_available() and dist.is_initialized())
    ctx = init_distributed(backend=backend, device=device, timeout_s=timeout_s)
    try:
        yield ctx
    finally:
        if owned:
            teardown()


# ----------------------------------------------------------------------------------------------------
# Records: one JSON line per measurement, one file per rank
# ----------------------------------------------------------------------------------------------------
def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    ctx = dist_context()
    return ctx.rank, ctx.world_size


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars, without importing numpy here
        return value.tolist()
    raise TypeError(
        f"record value of type {type(value).__name__} is not JSON-serialisable: "
        "convert it first (float(x), x.tolist(), str(x))"
    )


def write_record(record: Mapping[str, Any], records_dir: str | os.PathLike | None = None) -> Path | None:
    """Append ``record`` (plus ``rank`` and ``world_size``) as one JSON line to ``<dir>/rank<r>.jsonl``.

    ``dir`` defaults to ``$DLO_RECORDS_DIR``, which :func:`launch` sets for the ranks it starts. When it
    is unset the call does nothing and returns None, so the same script also runs standalone. One file
    per rank means no two processes ever write to the same file. Returns the file written.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"record must be a dict, got {type(record).__name__}")
    target = records_dir if records_dir is not None else os.environ.get(RECORDS_ENV)
    if not target:
        return None
    rank, world = _rank_and_world()
    for key, actual in (("rank", rank), ("world_size", world)):
        if key in record and record[key] != actual:
            raise ValueError(
                f"record has {key}={record[key]!r} but this process has {key}={actual}: "
                "drop that key, it is added for you"
            )
    line = json.dumps({**record, "rank": rank, "world_size": world}, default=_jsonable)
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.jsonl"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    return path


def read_records(records_dir: str | os.PathLike | None = None) -> list[dict]:
    """All records under ``records_dir`` (default ``$DLO_RECORDS_DIR``), sorted by rank, then write order."""
    target = records_dir if records_dir is not None else os.environ.get(RECORDS_ENV)
    if not target:
        raise ValueError(f"no records folder given and ${RECORDS_ENV} is not set: pass read_records(path)")
    folder = Path(target)
    if not folder.is_dir():
        raise ValueError(f"records folder {folder} does not exist: check the path launch() returned or printed")
    files = sorted(
        ((int(m.group(1)), p) for p in folder.iterdir() if (m := _RECORD_FILE.match(p.name))), key=lambda rp: rp[0]
    )
    out: list[dict] = []
    for _, path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{number} is not valid JSON ({exc.msg}): was that rank killed while writing?"
                ) from None
    return out


# ----------------------------------------------------------------------------------------------------
# Failure notes: which rank failed *first*
# ----------------------------------------------------------------------------------------------------
def _exception_line(etype: type, value: BaseException) -> str:
    """The ``ValueError: boom`` line Python prints last in a traceback."""
    lines = "".join(traceback.format_exception_only(etype, value)).splitlines()
    for line in lines:
        if line and not line[0].isspace():
            return line.strip()
    return lines[-1].strip() if lines else etype.__name__


def _install_failure_hook() -> None:
    """When running under :func:`launch`, note the time and message of an uncaught exception.

    When rank 1 crashes, rank 0 usually crashes a few milliseconds later with "Connection closed by
    peer" while waiting for it. torchrun only knows exit times to the second, so it cannot tell which
    came first; this note (float timestamp) lets :func:`launch` blame the rank that really failed first.
    """
    records = os.environ.get(RECORDS_ENV)
    if not records or getattr(sys.excepthook, "_dlo_failure_hook", False):
        return
    previous = sys.excepthook
    folder = Path(records) / _FAILURES_SUBDIR

    def hook(etype, value, tb):
        try:
            rank = dist_context().rank
            folder.mkdir(parents=True, exist_ok=True)
            note = {"rank": rank, "time": time.time(), "pid": os.getpid(), "exception": _exception_line(etype, value)}
            (folder / f"rank{rank}.json").write_text(json.dumps(note), encoding="utf-8")
        except Exception:  # noqa: BLE001 - a failing diagnostic must never hide the real exception
            pass
        previous(etype, value, tb)

    hook._dlo_failure_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


_install_failure_hook()  # a script started by launch() is covered from its first `import dlo.env`


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------
class LaunchError(RuntimeError):
    """A launched run failed. ``str(err)`` is one line; the details are attributes.

    ``rank`` / ``exit_code`` / ``last_line``: the rank blamed (None if unknown) and what it said last;
    ``log``: every output line, rank-prefixed; ``command``: what was run; ``records_dir``: where the
    records, ``launch.log`` and torchrun's per-rank logs are; ``timed_out``: True when stopped by ``timeout_s``.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        last_line: str = "",
        log: str = "",
        command: Sequence[str] = (),
        records_dir: Path | None = None,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.last_line = last_line
        self.log = log
        self.command = list(command)
        self.records_dir = records_dir
        self.timed_out = timed_out


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it). Someone else may take it before you do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check_nproc(nproc: Any) -> int:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    return nproc


def _check_args(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)):
        raise ValueError(f"args must be a list of strings like ['--epochs', '3'], not the single string {args!r}")
    return [str(a) for a in args]


def build_launch_command(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    nproc: int = 2,
    use_srun: bool | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    log_dir: str | os.PathLike | None = None,
) -> list[str]:
    """The command :func:`launch` runs, as a list (no side effects, so it can be shown and tested).

    * Inside a Slurm allocation (``SLURM_JOB_ID`` set) or with ``use_srun=True``:
      ``srun --ntasks N --kill-on-bad-exit=1 --label --export=ALL python script args``. srun starts the
      N tasks on the allocated nodes; ``--label`` prefixes each output line with the task number and
      ``--kill-on-bad-exit`` stops every task as soon as one fails (otherwise the others hang in a collective).
    * Elsewhere: ``python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node N --tee 3 script args``.
      ``--standalone`` lets torchrun's rendezvous bind a free port itself (no port clash between runs),
      ``--tee 3`` copies each worker's stdout and stderr to the console prefixed ``[default<rank>]:``.
      ``log_dir`` (torchrun's ``--log-dir``) is where it keeps per-rank log files.
    """
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    env = os.environ if environ is None else environ
    if use_srun is None:
        use_srun = bool(env.get("SLURM_JOB_ID"))
    if use_srun:
        return ["srun", "--ntasks", str(nproc), "--kill-on-bad-exit=1", "--label", "--export=ALL",
                sys.executable, str(script), *args]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--tee", "3"]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    return cmd + [str(script), *args]


_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")
_TORCHRUN_PREFIX = re.compile(r"^\[[A-Za-z_][A-Za-z_]*?(\d+)\]:(.*)$", re.S)  # "[default1]:text"
_SRUN_PREFIX = re.compile(r"^\s*(\d+): ?(.*)$", re.S)  # " 1: text" (srun --label)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_SRUN_FAILURE = re.compile(r"task (\d+): Exited with exit code (\d+)")


def _last_meaningful(lines: Sequence[str]) -> str:
    """The exception line after the last traceback, else the last non-blank line."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Traceback (most recent call last)"):
            for line in lines[start + 1 :]:
                if line.strip() and not line[0].isspace():
                    return line.strip()
            break
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""


def _blame(
    own_lines: Sequence[str],
    per_rank: Mapping[int, Sequence[str]],
    notes: Sequence[Mapping[str, Any]],
    srun: bool,
    returncode: int,
) -> tuple[int | None, int | None, str]:
    """Which rank to blame for a failed run: ``(rank or None, exit code, last meaningful line)``.

    1. The failure notes written by the ranks' excepthook: the earliest exception wins.
    2. Else the launcher's own report (torchrun's "rank : 1 ... exitcode : 1" summary, srun's
       "task 1: Exited with exit code 1"): the lowest rank that exited with an error code, ranks killed
       by a signal (negative codes, usually killed by the launcher itself) only if nothing else failed.
    3. Else nobody in particular: the launcher's own last line (it may not have started any rank).
    """
    text = "\n".join(own_lines)
    codes = {int(r): int(c) for r, c in (_SRUN_FAILURE if srun else _TORCHRUN_FAILURE).findall(text)}
    if notes:
        first = min(notes, key=lambda n: n["time"])
        rank = int(first["rank"])
        return rank, codes.get(rank, returncode), str(first["exception"])
    if codes:
        genuine = [r for r, c in codes.items() if c > 0]
        rank = min(genuine or codes)
        return rank, codes[rank], _last_meaningful(per_rank.get(rank, []))
    return None, returncode, _last_meaningful(own_lines)


def _pump(stream, out: queue.Queue) -> None:
    """Reader thread: hand each line of one pipe to the caller's thread; None marks the end."""
    for line in iter(stream.readline, ""):
        out.put(line)
    out.put(None)


def _usable_cpus() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity, unlike os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def _stop(proc: subprocess.Popen, grace_s: float = 40.0) -> None:
    """SIGTERM first (torchrun and srun then stop their workers cleanly), SIGKILL if that is not enough."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def expand_runs(args: Any, runs_json: str | None) -> list[tuple[str, Any]]:
    """The configurations of a "several runs in one launch" script: ``[(name, args_for_that_run), ...]``.

    ``runs_json`` (a script's ``--runs`` option) is a JSON list of dicts, each overriding some of the
    parsed ``args`` (an ``argparse.Namespace``) and optionally naming the run (``"name"``, default
    ``run<i>``); None or empty means one run with ``args`` as they are. Starting processes costs seconds,
    so a notebook measures several configurations in one launch. A key that is not an option of the script
    is a one-line error naming the options there are.
    """
    import argparse

    runs = json.loads(runs_json) if runs_json else [{}]
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"--runs must be a JSON list of dicts, got {runs_json!r}")
    out = []
    for i, overrides in enumerate(runs):
        overrides = dict(overrides)
        name = str(overrides.pop("name", f"run{i}"))
        unknown = sorted(set(overrides) - set(vars(args)))
        if unknown:
            raise ValueError(f"--runs entry {name!r} sets unknown option(s) {', '.join(unknown)}: "
                             f"use {', '.join(sorted(vars(args)))}")
        out.append((name, argparse.Namespace(**{**vars(args), **overrides})))
    return out


def launch(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    nproc: int = 2,
    *,
    records_dir: str | os.PathLike | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout_s: float | None = None,
    use_srun: bool | None = None,
    echo: bool = True,
) -> list[dict]:
    """Run ``script`` on ``nproc`` processes, stream their output, return the records they wrote.

    Every line is printed as it arrives, prefixed with its origin: ``[rank1] ...`` for a worker,
    ``[torchrun] ...`` / ``[srun] ...`` for the launcher itself (``echo=False`` keeps quiet). Printing
    happens in the caller's thread, so it shows up in the right Jupyter cell.

    The workers get ``DLO_RECORDS_DIR`` (``records_dir``, or a fresh ``runs/launch/<script>-<time>-*``
    folder), ``PYTHONUNBUFFERED=1`` (lines arrive live, not in 8 KiB chunks when the process ends),
    ``OMP_NUM_THREADS`` = cores / nproc unless set (N processes each using every core fight for them;
    under srun, ``SLURM_CPUS_PER_TASK``),
    plus ``env`` (a value of None removes that variable). Rank variables of the caller (``RANK``,
    ``WORLD_SIZE``...) are not passed on: each rank gets its own from the launcher. Inside Slurm,
    ``srun`` is used (see :func:`build_launch_command`).

    If a rank fails, or ``timeout_s`` passes, raises :class:`LaunchError` naming the rank that failed
    first, its exit code and its last meaningful line (usually the exception). The whole log is also
    written to ``<records_dir>/launch.log``.
    """
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    script_path = Path(script).expanduser().resolve()
    if not script_path.is_file():
        raise ValueError(f"script {script} does not exist (resolved to {script_path}): check the path")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")

    if records_dir is None:
        from .paths import run_dir

        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = Path(tempfile.mkdtemp(prefix=f"{script_path.stem}-{stamp}-", dir=run_dir("launch")))
    else:
        folder = Path(records_dir).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        if any(_RECORD_FILE.match(p.name) for p in folder.iterdir()):
            raise ValueError(
                f"records folder {folder} already holds rank*.jsonl from an earlier run: "
                "pass an empty folder or records_dir=None"
            )

    # The ranks get their numbers from torchrun / srun, never from the caller (which may itself be a rank).
    child_env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(str(key), None)
        else:
            child_env[str(key)] = str(value)
    child_env[RECORDS_ENV] = str(folder)
    child_env["PYTHONUNBUFFERED"] = "1"
    srun = use_srun if use_srun is not None else bool(child_env.get("SLURM_JOB_ID"))
    if srun:
        job_tasks = child_env.get("SLURM_NTASKS", "").strip()
        if use_srun is None and job_tasks.isdigit() and int(job_tasks) < nproc:
            raise ValueError(
                f"this Slurm job has {job_tasks} task(s) but launch() asked for nproc={nproc}: "
                f"submit with --ntasks {nproc} (or --ntasks-per-node), "
                "or pass use_srun=False to run torchrun on this node"
            )
        cpus = child_env.get("SLURM_CPUS_PER_TASK")
        if cpus:
            child_env.setdefault("OMP_NUM_THREADS", cpus)
            child_env.setdefault("SRUN_CPUS_PER_TASK", cpus)  # srun >= 22.05 no longer inherits --cpus-per-task
    else:
        child_env.setdefault("OMP_NUM_THREADS", str(max(1, _usable_cpus() // nproc)))
    command = build_launch_command(script_path, args, nproc, srun, child_env, log_dir=folder / "torchrun")
    launcher = "srun" if srun else "torchrun"
    worker_prefix = _SRUN_PREFIX if srun else _TORCHRUN_PREFIX

    log_lines: list[str] = []
    per_rank: dict[int, list[str]] = {}
    own_lines: list[str] = []
    latest: tuple[int, str] | None = None  # the last non-blank line any rank printed (for timeouts)

    def emit(raw: str) -> None:
        nonlocal latest
        text = raw.rstrip("\n")
        match = worker_prefix.match(text)
        if match is not None:
            rank, body = int(match.group(1)), match.group(2)
            # torch.distributed already prefixes uncaught-exception lines with "[rank1]: ": keep one prefix
            if body.startswith(f"[rank{rank}]:"):
                body = body[len(f"[rank{rank}]:"):].removeprefix(" ")
            per_rank.setdefault(rank, []).append(body)
            if body.strip():
                latest = (rank, body.strip())
            shown = f"[rank{rank}] {body}"
        else:
            own_lines.append(text)
            shown = f"[{launcher}] {text}"
        log_lines.append(shown)
        if echo:
            print(shown, flush=True)

    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=child_env,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,  # our own process group, so a timeout can signal the launcher and only it
        )
    except FileNotFoundError:
        raise RuntimeError(f"cannot start {command[0]!r}: is it installed and on PATH?") from None

    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_pump, args=(pipe, lines), daemon=True) for pipe in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    started = time.time()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    open_streams, timed_out, exited_at = 2, False, None
    try:
        while open_streams:
            if deadline is not None and time.monotonic() > deadline and proc.poll() is None:
                timed_out = True
                _stop(proc)
            try:
                raw = lines.get(timeout=0.1)
            except queue.Empty:
                if proc.poll() is not None:
                    # a stray grandchild may keep a pipe open after the launcher exited: do not wait forever
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > 5:
                        break
                continue
            if raw is None:
                open_streams -= 1
            else:
                emit(raw)
        proc.wait()
    except BaseException:  # KeyboardInterrupt from the notebook's stop button included: do not leave workers behind
        _stop(proc, grace_s=10)
        raise
    finally:
        (folder / "launch.log").write_text("\n".join(log_lines) + "\n", encoding="utf-8")

    if proc.returncode == 0 and not timed_out:
        return read_records(folder)

    log = "\n".join(log_lines)
    name = script_path.name
    where = f"full log: {folder / 'launch.log'}"
    if timed_out:
        rank, last = latest if latest is not None else (None, _last_meaningful(own_lines))
        shown = f"[rank{rank}] {last}" if rank is not None else (last or "(no output)")
        raise LaunchError(
            f"{name} on {nproc} processes timed out after {timeout_s:g} s and was stopped; "
            f"last output: {shown} ({where})",
            rank=rank, last_line=last, log=log, command=command, records_dir=folder, timed_out=True,
        )

    notes = []
    for path in (folder / _FAILURES_SUBDIR).glob("rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            note = json.loads(path.read_text(encoding="utf-8"))
            if note.get("time", 0) >= started:  # ignore notes left by an earlier run in the same folder
                notes.append(note)
    rank, code, last = _blame(own_lines, per_rank, notes, srun, proc.returncode)
    who = f"rank {rank}" if rank is not None else launcher
    raise LaunchError(
        f"{who} of {name} failed with exit code {code}: {last or '(no output)'} ({where})",
        rank=rank, exit_code=code, last_line=last, log=log, command=command, records_dir=folder,
    )
