"""Who am I, how many are we, where do we meet: the distributed context read from torchrun's or Slurm's
environment variables (no process group is made here; see :mod:`dlo.runtime.distributed`)."""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping




DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's own default, so single-process and torchrun runs look alike


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes the source ports of outgoing connections from (Linux: 32768-60999)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for the ranks of a local run to meet on.

    It is drawn outside the kernel's ephemeral range: a port from that range can be taken, between this check
    and rank 0's bind, as the source port of any outgoing connection on the machine (another run's gloo
    sockets, for one), and rank 0 then fails with EADDRINUSE. Another launch drawing the same port at the same
    moment is still possible, only far less likely. Drawn with the system's random source, so a seeded
    ``random`` in the caller is left alone."""
    import random
    import socket

    low, high = _ephemeral_ports()
    choices = range(10000, low) if low - 10000 >= 1000 else range(high + 1, 65536)
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.choice(choices)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # all taken: let the OS pick one
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        return _from_torchrun(env)
    if "SLURM_PROCID" in env and any(k in env for k in _SLURM_STEP_MARKERS):
        return _from_slurm(env)
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


def _from_torchrun(env: Mapping[str, str]) -> DistContext:
    """The context torchrun's variables describe (or Slurm's, once :func:`init_distributed` exported them so)."""
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


def _from_slurm(env: Mapping[str, str]) -> DistContext:
    """The context of a task started by ``srun`` (see :func:`dist_context` for the rules)."""
    rank = _int_var(env, "SLURM_PROCID")
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if not ntasks:
        raise ValueError("Slurm task without SLURM_STEP_NUM_TASKS or SLURM_NTASKS: launch it with srun --ntasks N")
    world = _int_var({"SLURM_NTASKS": ntasks}, "SLURM_NTASKS")
    node_rank = _int_var(env, "SLURM_NODEID", 0)
    local_rank = _int_var(env, "SLURM_LOCALID", 0)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    hosts = expand_nodelist(nodelist) if nodelist else []
    local_world = _slurm_local_world(env, world, node_rank, hosts)
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


def _slurm_local_world(env: Mapping[str, str], world: int, node_rank: int, hosts: list[str]) -> int:
    """How many tasks of the step run on this node."""
    per_node_spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE") or env.get(
        "SLURM_TASKS_PER_NODE"
    )
    if per_node_spec:
        per_node = _expand_tasks_per_node(per_node_spec)
        if len(set(per_node)) == 1:  # the usual case: the same number of tasks on every node
            return per_node[0]
        elif node_rank < len(per_node):
            return per_node[node_rank]
        else:
            raise ValueError(
                f"SLURM_NODEID={node_rank} has no entry in tasks-per-node {per_node_spec!r}: "
                "launch with srun --ntasks-per-node N"
            )
    elif len(hosts) == 1:
        return world
    else:
        raise ValueError(
            "cannot tell how many Slurm tasks run on this node (SLURM_STEP_TASKS_PER_NODE is not set): "
            "launch with srun --ntasks-per-node N"
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
# Records: one JSON line per measurement, one file per rank
# ----------------------------------------------------------------------------------------------------
def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    ctx = dist_context()
    return ctx.rank, ctx.world_size


def is_main_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
