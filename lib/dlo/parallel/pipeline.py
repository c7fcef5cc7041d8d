"""Pipeline parallelism from scratch: stage split, point-to-point transfers, schedules, event log.

A model too big for one device is cut into ``p`` **stages** of consecutive layers, one per process.
Micro-batch ``i`` flows forward through stage 0, 1, ..., p-1 (activations sent to the next stage), then
its gradients flow back (activation gradients sent to the previous stage). The order in which each stage
runs its forwards (F) and backwards (B) is the **schedule**:

* ``naive``: the whole batch at once; stage k idles while the others work (bubble ``(p-1)/p``);
* ``afab`` (GPipe): cut the batch into ``m`` micro-batches, all forwards, then all backwards
  (bubble ``(p-1)/(m+p-1)``, but ``m`` micro-batches of activations alive at once);
* ``1f1b``: ``p - rank - 1`` warm-up forwards, then one forward / one backward, then the remaining
  backwards: the same bubble, at most ``p`` micro-batches alive;
* ``interleaved``: each rank holds ``v`` chunks (virtual stages) ``r, r+p, ...``: bubble ``(p-1)/(v*m+p-1)``.

The building blocks a schedule is written with are the methods of :class:`Pipe` (one per rank)::

    x = pipe.recv_forward(i)          # activation of micro-batch i from the previous stage (tokens on stage 0)
    y = pipe.forward_compute(i, x)    # run the stage, keep what backward needs, log an F event
    pipe.send_forward(i, y)           # to the next stage (nothing on the last stage: y is the loss)
    g = pipe.recv_backward(i)         # gradient of y from the next stage (None on the last stage)
    dx = pipe.backward_compute(i, g)  # backward through the stage, log a B event, free micro-batch i
    pipe.send_backward(i, dx)         # gradient of x to the previous stage (nothing on stage 0)

Each micro-batch's loss is divided by ``m`` and the gradients accumulate in ``.grad`` over the
micro-batches, so one pipeline step gives the gradient of the mean loss of the whole batch: the same
as one process running the whole model (tested, fp32). The transfers use fixed shapes
``[micro_batch, seq, hidden]`` known in advance (no shape message needed).

**When the transfers go out.** A ``send_*`` or ``recv_*`` call only *asks* for a transfer. The Pipe posts
every transfer asked for since the previous compute **together**, in one ``batch_isend_irecv``, right
before the next ``forward_compute`` / ``backward_compute`` (and the last ones in :meth:`Pipe.finish`);
the tensor a ``recv_*`` returns is filled by then. This matters on GPUs: with NCCL a large send (beyond
NCCL's internal buffer, a few MiB) does not complete until the receiver has posted the matching receive,
and between two ranks NCCL pairs the n-th send with the n-th receive, whatever the tags. Posted one by
one, 1F1B's "send my activation, then receive a gradient" on one rank and "send my gradient, then
receive an activation" on its neighbour wait for each other forever. Posted together (what Megatron-LM's
``send_forward_recv_backward`` does), both complete. :mod:`dlo.parallel.p2p_replay` replays every
schedule's transfers under NCCL's rules to show it cannot deadlock.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dlo.models.llama import Llama, lm_loss, rotary_cos_sin

SCHEDULE_NAMES = ("naive", "afab", "1f1b", "interleaved")


# ----------------------------------------------------------------------------------------------------
# Configuration checks (one clear line each)
# ----------------------------------------------------------------------------------------------------
def micro_batch_size(batch: int, micro_batches: int) -> int:
    """``batch // micro_batches``, or a ValueError saying what to choose instead."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    if batch % micro_batches:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise ValueError(f"batch {batch} cannot be cut into {micro_batches} equal micro-batches: choose micro_batches "
                         f"among the divisors of {batch} ({', '.join(map(str, divisors))}) or change the batch")
    return batch // micro_batches


def check_world_size(world_size: int, num_stages: int, data_parallel: int = 1) -> None:
    """One process per stage (times ``data_parallel`` replicas of the whole pipeline)."""
    if num_stages < 1 or data_parallel < 1:
        raise ValueError(f"num_stages ({num_stages}) and data_parallel ({data_parallel}) must be >= 1")
    if data_parallel == 1 and world_size != num_stages:
        raise ValueError(f"world size {world_size} != {num_stages} pipeline stages: launch one process per stage "
                         f"(nproc={num_stages}) or set the number of stages to {world_size}")
    if world_size != num_stages * data_parallel:
        raise ValueError(f"world size {world_size} is not {num_stages} stages x {data_parallel} data-parallel "
                         f"replicas = {num_stages * data_parallel}: launch nproc={num_stages * data_parallel}")


# ----------------------------------------------------------------------------------------------------
# Stage split
# ----------------------------------------------------------------------------------------------------
def _layer_costs(model: Llama) -> tuple[list[int], int, int]:
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.layers]
    first = model.embed_tokens.weight.numel()
    last = model.norm.weight.numel() + (0 if model.cfg.tie_embeddings else model.lm_head.weight.numel())
    return layers, first, last


def split_layers(num_layers: int, num_stages: int, *, by: str = "layers", layer_costs: Sequence[float] | None = None,
                 first_cost: float = 0.0, last_cost: float = 0.0) -> list[range]:
    """Consecutive layer ranges, one per stage.

    ``by="layers"``: as equal counts as possible (the first stages get one more when it does not divide).
    ``by="params"``: the split minimising the largest stage cost, where stage 0 also pays ``first_cost``
    (embedding) and the last stage ``last_cost`` (final norm + head): with a big vocabulary the end
    stages get fewer layers. Every stage gets at least one layer.
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if num_stages > num_layers:
        raise ValueError(f"{num_stages} stages for {num_layers} layers: every stage needs at least one layer; "
                         f"use at most {num_layers} stages or a deeper model")
    if by == "layers":
        base, extra = divmod(num_layers, num_stages)
        out, start = [], 0
        for s in range(num_stages):
            n = base + (1 if s < extra else 0)
            out.append(range(start, start + n))
            start += n
        return out
    if by != "params":
        raise ValueError(f"split by {by!r}? choose 'layers' (equal layer counts) or 'params' (balanced parameters)")
    if layer_costs is None or len(layer_costs) != num_layers:
        raise ValueError("by='params' needs layer_costs, one number per layer")
    costs = [float(c) for c in layer_costs]
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(s: int, a: int, b: int) -> float:  # stage s holds layers a..b-1
        return prefix[b] - prefix[a] + (first_cost if s == 0 else 0.0) + (last_cost if s == num_stages - 1 else 0.0)

    # best[s][b]: smallest max cost of stages 0..s holding layers 0..b-1
    inf = math.inf
    best = [[inf] * (num_layers + 1) for _ in range(num_stages)]
    cut = [[0] * (num_layers + 1) for _ in range(num_stages)]
    for b in range(1, num_layers + 1):
        best[0][b] = cost(0, 0, b)
    for s in range(1, num_stages):
        for b in range(s + 1, num_layers + 1):
            for a in range(s, b):
                v = max(best[s - 1][a], cost(s, a, b))
                if v < best[s][b]:
                    best[s][b], cut[s][b] = v, a
    bounds, b = [], num_layers
    for s in range(num_stages - 1, 0, -1):
        a = cut[s][b]
        bounds.append(range(a, b))
        b = a
    bounds.append(range(0, b))
    return bounds[::-1]


class Stage(nn.Module):
    """One piece of a :class:`~dlo.models.llama.Llama`: the embedding if it is the first piece, some decoder
    blocks, the final norm + LM head if it is the last. Its modules *are* the model's (shared, not copied),
    and its parameter names are the model's (``layers.3.mlp.up_proj.weight``), so gradients compare by name.

    ``forward`` takes token ids on the first stage and hidden states ``[b, s, hidden]`` elsewhere; it
    returns hidden states, or the logits on the last stage (:meth:`loss` turns them into the loss).
    """

    def __init__(self, model: Llama, layers: range, *, index: int, num_stages: int) -> None:
        super().__init__()
        self.index, self.num_stages = index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.layer_ids = list(layers)
        self.head_dim, self.rope_theta = model.cfg.head_dim, model.rope_theta
        self.hidden_size = model.cfg.hidden_size
        self.embed_tokens = model.embed_tokens if self.is_first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        cos, sin = rotary_cos_sin(x.shape[1], self.head_dim, theta=self.rope_theta, device=x.device, dtype=x.dtype)
        for layer in self.layers.values():
            x = layer(x, cos, sin)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm_loss(logits, labels)

    def extra_repr(self) -> str:
        parts = (["embedding"] if self.is_first else []) + [f"layers {self.layer_ids[0]}-{self.layer_ids[-1]}"] + (
            ["norm + head + loss"] if self.is_last else [])
        return f"stage {self.index}/{self.num_stages}: " + ", ".join(parts)


def split_model(model: Llama, num_stages: int, *, by: str = "layers") -> list[Stage]:
    """All the stages of ``model`` (stage ``k`` for rank ``k``; use :func:`build_stage` for one)."""
    if not isinstance(model, Llama):
        raise ValueError(f"split_model cuts a dlo.models.llama.Llama, got {type(model).__name__}")
    if model.cfg.tie_embeddings and num_stages > 1:
        raise ValueError("tied embeddings live on the first and the last stage at once (their gradients would need "
                         "an extra all-reduce between them): build the model with tie_embeddings=False")
    costs, first, last = _layer_costs(model)
    ranges = split_layers(len(model.layers), num_stages, by=by, layer_costs=costs, first_cost=first, last_cost=last)
    return [Stage(model, r, index=k, num_stages=num_stages) for k, r in enumerate(ranges)]


def build_stage(model: Llama, rank: int, num_stages: int, *, by: str = "layers") -> Stage:
    """The stage of ``model`` that rank ``rank`` runs."""
    if not 0 <= rank < num_stages:
        raise ValueError(f"rank {rank} has no stage: stages are 0..{num_stages - 1}")
    return split_model(model, num_stages, by=by)[rank]


def build_chunks(model: Llama, rank: int, num_stages: int, virtual: int, *, by: str = "layers") -> list[Stage]:
    """Interleaved pipeline: the model is cut into ``num_stages * virtual`` chunks; rank ``r`` holds chunks
    ``r, r + p, r + 2p, ...`` (so a micro-batch visits every rank ``virtual`` times)."""
    if virtual < 1:
        raise ValueError(f"virtual stages per rank must be >= 1, got {virtual}")
    chunks = split_model(model, num_stages * virtual, by=by)
    return [chunks[c * num_stages + rank] for c in range(virtual)]


# ----------------------------------------------------------------------------------------------------
# Event log
# ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Event:
    """One compute action of one rank: micro-batch ``mb`` of chunk ``chunk``, ``kind`` "F" or "B",
    ``start``/``end`` in seconds since the step began (after a barrier)."""

    rank: int
    mb: int
    kind: str
    start: float
    end: float
    chunk: int = 0


@dataclasses.dataclass
class StepStats:
    """What one rank measured during one pipeline step."""

    rank: int
    loss: float | None
    events: list[Event]
    max_in_flight: int
    peak_activation_bytes: int
    peak_memory_bytes: int | None
    step_s: float

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["events"] = [dataclasses.asdict(e) for e in self.events]
        return d


@dataclasses.dataclass
class Transfer:
    """One point-to-point transfer a rank asked for: ``kind`` "send" or "recv", ``peer`` the other rank,
    ``tensor`` what is sent (or the buffer a receive fills), ``tag`` which tensor it is (gloo matches on it,
    NCCL ignores it), ``what`` the same in words."""

    kind: str
    peer: int
    tensor: torch.Tensor
    tag: int
    what: str = ""


# ----------------------------------------------------------------------------------------------------
# The per-rank pipeline engine
# ----------------------------------------------------------------------------------------------------
class Pipe:
    """Everything one rank needs to run a schedule: its stage(s), the batch, P2P transfers, the log.

    ``stages``: this rank's :class:`Stage` (or the list of its chunks for an interleaved schedule).
    ``batch``: ``(input_ids, labels)`` of the whole step, identical on every rank (stage 0 reads the
    ids, the last stage the labels). Transfers are asked for by ``send_*`` / ``recv_*`` and posted
    together just before the next compute (see the module's docstring). ``blocking=True``: the rank then
    waits until every transfer of that batch is done, sends included (a send waits for its receiver).
    ``blocking=False``: it waits for a batch only if it receives something (the data is needed now); a
    batch of sends only is waited for in :meth:`finish`, the rank goes on computing meanwhile.
    Without a process group (one process, one stage) transfers are never needed.
    """

    def __init__(self, stages: Stage | Sequence[Stage], batch: tuple[torch.Tensor, torch.Tensor], micro_batches: int,
                 *, rank: int = 0, world_size: int = 1, blocking: bool = False, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.chunks = [stages] if isinstance(stages, Stage) else list(stages)
        if not self.chunks:
            raise ValueError("a Pipe needs at least one stage")
        self.rank, self.world_size = rank, world_size
        self.num_stages = self.chunks[0].num_stages  # virtual stages over all ranks
        if self.num_stages != world_size * len(self.chunks):
            raise ValueError(f"{self.num_stages} stages over {world_size} processes x {len(self.chunks)} chunks: "
                             f"world size != number of stages; launch nproc={self.num_stages // len(self.chunks)}")
        ids, labels = batch
        self.micro_batches = micro_batches
        mbs = micro_batch_size(ids.shape[0], micro_batches)
        self.device, self.dtype, self.blocking = torch.device(device), dtype, blocking
        self.ids = ids.to(self.device).split(mbs)
        self.labels = labels.to(self.device).split(mbs)
        self.act_shape = (mbs, ids.shape[1], self.chunks[0].hidden_size)
        self.reset()

    # --- bookkeeping -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the previous step (not the gradients: call ``optimizer.zero_grad()`` for that)."""
        self._saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor, int]] = {}
        self._pending: list[Transfer] = []  # asked for since the last compute, not posted yet
        self._sends: list[tuple[list[Any], list[torch.Tensor]]] = []  # posted sends not waited for yet
        self.batches_posted = 0
        self._mailbox: dict[int, torch.Tensor] = {}
        self.events: list[Event] = []
        self.losses: list[float] = []
        self.in_flight = self.max_in_flight = 0
        self.activation_bytes = self.peak_activation_bytes = 0
        self.done: set[tuple[int, int]] = set()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._collectives():
            dist.barrier()
        self.t0 = time.perf_counter()

    def _collectives(self) -> bool:
        """Whether this Pipe talks to other processes (a process group of more than one rank)."""
        return dist.is_available() and dist.is_initialized() and self.world_size > 1

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0

    def _stage(self, chunk: int) -> Stage:
        if not 0 <= chunk < len(self.chunks):
            raise ValueError(f"chunk {chunk} does not exist on rank {self.rank} (it holds {len(self.chunks)})")
        return self.chunks[chunk]

    def _peer(self, chunk: int, step: int) -> int:
        return (self._stage(chunk).index + step) % self.world_size

    def _tag(self, mb: int, boundary: int, backward: bool) -> int:
        # one tag per (stage boundary, direction, micro-batch): two ranks may exchange forward and backward
        # traffic in the same direction (interleaved schedules, 2 ranks); gloo matches on tags
        return ((mb * self.num_stages + boundary) * 2 + int(backward)) % (2 ** 31 - 1)

    # --- point-to-point ------------------------------------------------------------------------------
    def _what(self, mb: int, boundary: int, backward: bool) -> str:
        if backward:
            return f"gradient of micro-batch {mb}, stage {boundary + 1} -> {boundary}"
        return f"activation of micro-batch {mb}, stage {boundary} -> {boundary + 1}"

    def _recv(self, src: int, mb: int, boundary: int, backward: bool) -> torch.Tensor:
        tag = self._tag(mb, boundary, backward)
        if src == self.rank:  # a chunk of this very rank (interleaved on one process): no transfer
            if tag not in self._mailbox:
                raise RuntimeError(f"rank {self.rank}: waiting for its own message {tag} that was never sent: "
                                   "the schedule receives before it sends (it would hang across processes)")
            return self._mailbox.pop(tag).clone()
        buf = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        self._request(Transfer("recv", src, buf, tag, self._what(mb, boundary, backward)))
        return buf  # filled when the transfers are posted, just before the next compute

    def _send(self, t: torch.Tensor, dst: int, mb: int, boundary: int, backward: bool) -> None:
        t = t.detach().contiguous()
        tag = self._tag(mb, boundary, backward)
        if dst == self.rank:
            self._mailbox[tag] = t
        else:
            self._request(Transfer("send", dst, t, tag, self._what(mb, boundary, backward)))

    def _request(self, transfer: Transfer) -> None:
        self._pending.append(transfer)

    def _flush(self) -> None:
        """Post the transfers asked for since the last compute, all together (one ``batch_isend_irecv``), and
        wait for them if one of them is a receive (or if ``blocking``). The compute methods and
        :meth:`finish` call it; a schedule never needs to."""
        if not self._pending:
            return
        ops, self._pending = self._pending, []
        self.batches_posted += 1
        works = self._post(ops)
        if self.blocking or any(op.kind == "recv" for op in ops):
            for work in works:
                work.wait()
        else:
            self._sends.append((works, [op.tensor for op in ops]))  # keep the tensors alive until sent

    def _post(self, ops: list[Transfer]) -> list[Any]:
        """The one place that talks to torch.distributed: one batch for ``ops``, whatever their number, so
        that NCCL sees every transfer of this Pipe the same way (a batch on the group's communicator)."""
        return dist.batch_isend_irecv([dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, op.tensor, op.peer,
                                                  tag=op.tag) for op in ops])

    def recv_forward(self, mb: int, chunk: int = 0) -> torch.Tensor:
        """The input of micro-batch ``mb``: its token ids on the first stage, else the previous stage's output."""
        stage = self._stage(chunk)
        if stage.is_first:
            return self.ids[mb]
        return self._recv(self._peer(chunk, -1), mb, stage.index - 1, False)

    def send_forward(self, mb: int, y: torch.Tensor, chunk: int = 0) -> None:
        """Send the output of micro-batch ``mb`` to the next stage (nothing to send from the last stage)."""
        stage = self._stage(chunk)
        if not stage.is_last:
            self._send(y, self._peer(chunk, +1), mb, stage.index, False)

    def recv_backward(self, mb: int, chunk: int = 0) -> torch.Tensor | None:
        """The gradient of micro-batch ``mb``'s output, from the next stage (None on the last stage)."""
        stage = self._stage(chunk)
        if stage.is_last:
            return None
        return self._recv(self._peer(chunk, +1), mb, stage.index, True)

    def send_backward(self, mb: int, dx: torch.Tensor | None, chunk: int = 0) -> None:
        """Send the gradient of micro-batch ``mb``'s input to the previous stage (nothing from stage 0)."""
        stage = self._stage(chunk)
        if not stage.is_first:
            if dx is None:
                raise ValueError(f"rank {self.rank}: send_backward of micro-batch {mb} got None: pass the input gradient")
            self._send(dx, self._peer(chunk, -1), mb, stage.index - 1, True)

    # --- compute -------------------------------------------------------------------------------------
    def forward_compute(self, mb: int, x: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        """Run the stage on micro-batch ``mb``; keep its input and output for the backward.
        Returns the output activation, or on the last stage the loss divided by ``micro_batches``.
        The transfers asked for since the last compute are posted (together) first."""
        stage = self._stage(chunk)
        if (mb, chunk) in self._saved or (mb, chunk) in self.done:
            raise ValueError(f"rank {self.rank}: forward of micro-batch {mb} (chunk {chunk}) ran twice in one step")
        self._flush()
        if not stage.is_first:
            x = x.detach().requires_grad_(True)
        start = self._now()
        y, nbytes = self._run_forward(stage, mb, x)
        end = self._now()
        self.events.append(Event(self.rank, mb, "F", start, end, chunk))
        self._saved[(mb, chunk)] = (x if not stage.is_first else None, y, nbytes)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.activation_bytes += nbytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, self.activation_bytes)
        return y

    def _run_forward(self, stage: Stage, mb: int, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The computation itself: ``(output or loss / m, bytes autograd saved for the backward)``."""
        saved = [0]
        weights = {q.untyped_storage().data_ptr() for q in stage.parameters()}
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:  # activations kept for backward (weights excluded, counted once)
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights and ptr not in seen:
                seen.add(ptr)
                saved[0] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = stage(x)
            if stage.is_last:
                loss = stage.loss(y, self.labels[mb])
                self.losses.append(loss.item())
                y = loss / self.micro_batches
        return y, saved[0]

    def backward_compute(self, mb: int, grad: torch.Tensor | None, chunk: int = 0) -> torch.Tensor | None:
        """Backward of micro-batch ``mb`` through the stage (gradients accumulate in ``.grad``); frees what its
        forward kept. Returns the gradient of the stage's input (None on the first stage).
        The transfers asked for since the last compute are posted (together) first."""
        stage = self._stage(chunk)
        if (mb, chunk) not in self._saved:
            raise ValueError(f"rank {self.rank}: backward of micro-batch {mb} (chunk {chunk}) before its forward")
        if not stage.is_last and grad is None:
            raise ValueError(f"rank {self.rank}: backward of micro-batch {mb} needs the gradient from the next stage")
        self._flush()
        x, y, nbytes = self._saved.pop((mb, chunk))
        start = self._now()
        dx = self._run_backward(stage, x, y, grad)
        end = self._now()
        self.events.append(Event(self.rank, mb, "B", start, end, chunk))
        self.in_flight -= 1
        self.activation_bytes -= nbytes
        self.done.add((mb, chunk))
        return dx

    def _run_backward(self, stage: Stage, x: torch.Tensor | None, y: torch.Tensor,
                      grad: torch.Tensor | None) -> torch.Tensor | None:
        """The computation itself: the gradient of the stage's input (None on the first stage)."""
        if stage.is_last:
            y.backward()
        else:
            torch.autograd.backward(y, grad_tensors=grad)
        return None if stage.is_first else x.grad

    # --- end of step -----------------------------------------------------------------------------------
    def finish(self) -> StepStats:
        """Post the last transfers, wait for the pending sends, check every micro-batch ran backward, share the
        loss; returns the stats."""
        self._flush()
        for works, _ in self._sends:
            for work in works:
                work.wait()
        self._sends.clear()
        missing = sorted({(mb, c) for mb in range(self.micro_batches) for c in range(len(self.chunks))} - self.done)
        if missing or self._saved:
            raise RuntimeError(f"rank {self.rank}: micro-batch(es) {[m for m, _ in missing]} never ran backward: "
                               "every micro-batch must run forward and backward in each step (else its gradients "
                               "are missing and its activations leak)")
        step_s = self._now()
        loss = None
        last_rank = (self.num_stages - 1) % self.world_size
        if any(c.is_last for c in self.chunks):
            loss = sum(self.losses) / len(self.losses)
        if self._collectives():
            t = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64, device=self.device)
            dist.broadcast(t, src=last_rank)
            loss = float(t.item())
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
        return StepStats(self.rank, loss, list(self.events), self.max_in_flight, self.peak_activation_bytes, peak,
                         step_s)


# ----------------------------------------------------------------------------------------------------
# Reference schedules (the workshop's solutions)
# ----------------------------------------------------------------------------------------------------
def _forward(pipe: Pipe, mb: int, chunk: int = 0) -> None:
    x = pipe.recv_forward(mb, chunk)
    y = pipe.forward_compute(mb, x, chunk)
    pipe.send_forward(mb, y, chunk)


def _backward(pipe: Pipe, mb: int, chunk: int = 0) -> None:
    g = pipe.recv_backward(mb, chunk)
    dx = pipe.backward_compute(mb, g, chunk)
    pipe.send_backward(mb, dx, chunk)


def naive_step(pipe: Pipe) -> None:
    """The whole batch as one micro-batch: forward, then backward; stage k waits for stage k-1."""
    if pipe.micro_batches != 1:
        raise ValueError(f"the naive schedule runs the whole batch at once: build the Pipe with micro_batches=1, "
                         f"not {pipe.micro_batches}")
    _forward(pipe, 0)
    _backward(pipe, 0)


def afab_step(pipe: Pipe) -> None:
    """GPipe: all forwards, then all backwards (micro-batch order)."""
    for mb in range(pipe.micro_batches):
        _forward(pipe, mb)
    for mb in range(pipe.micro_batches):
        _backward(pipe, mb)


def one_f_one_b_actions(rank: int, num_stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B order of one rank: ``[("F", 0), ("F", 1), ("B", 0), ...]``."""
    warmup = min(num_stages - rank - 1, micro_batches)
    actions = [("F", mb) for mb in range(warmup)]
    for i in range(micro_batches - warmup):
        actions += [("F", warmup + i), ("B", i)]
    actions += [("B", mb) for mb in range(micro_batches - warmup, micro_batches)]
    return actions


def one_f_one_b_step(pipe: Pipe) -> None:
    """1F1B: ``p - rank - 1`` warm-up forwards, then one forward / one backward, then the remaining backwards.

    In the steady state the Pipe posts a forward's send together with the next backward's receive (both
    with the next stage), and a backward's send with the next forward's receive (both with the previous
    stage): Megatron-LM's ``send_forward_recv_backward`` and ``send_backward_recv_forward``."""
    for kind, mb in one_f_one_b_actions(pipe.rank, pipe.world_size, pipe.micro_batches):
        (_forward if kind == "F" else _backward)(pipe, mb)


def interleaved_warmup(rank: int, num_stages: int, micro_batches: int, virtual: int) -> int:
    """How many forwards rank ``rank`` runs before its first backward in interleaved 1F1B (Megatron-LM's
    count): all ``m * v`` of them if ``m == p``, else ``(p - rank - 1) * 2 + (v - 1) * p`` (at most all)."""
    p, m, v = num_stages, micro_batches, virtual
    return m * v if m == p else min(m * v, (p - rank - 1) * 2 + (v - 1) * p)


def interleaved_actions(rank: int, num_stages: int, micro_batches: int, virtual: int
                        ) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B order for one rank: ``(kind, micro-batch, chunk)``.

    Micro-batches go in groups of ``p``: forward chunk 0 of the group, then chunk 1, ...; backwards visit
    the chunks in reverse. Warm-up: :func:`interleaved_warmup` forwards, then one forward / one backward,
    then the backwards left. Needs ``micro_batches`` to be a multiple of ``p``.
    """
    p, m, v = num_stages, micro_batches, virtual
    if m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in groups of {p} stages: use a multiple of {p}, not {m}")
    total = m * v

    def fwd(k: int) -> tuple[int, int]:  # k-th forward of this rank -> (micro-batch, chunk)
        group, within = divmod(k, p * v)
        return group * p + within % p, within // p

    def bwd(k: int) -> tuple[int, int]:
        mb, chunk = fwd(k)
        return mb, v - 1 - chunk

    warmup = interleaved_warmup(rank, p, m, v)
    actions: list[tuple[str, int, int]] = [("F", *fwd(k)) for k in range(warmup)]
    for i in range(total - warmup):
        actions += [("F", *fwd(warmup + i)), ("B", *bwd(i))]
    actions += [("B", *bwd(k)) for k in range(total - warmup, total)]
    return actions


def interleaved_steps(rank: int, num_stages: int, micro_batches: int, virtual: int
                      ) -> list[list[tuple[str, int, int]]]:
    """:func:`interleaved_actions` cut into the steps whose transfers go out together: one forward per step
    in the warm-up, one forward + one backward per step in the steady state, one backward per step in the
    cool-down."""
    actions = interleaved_actions(rank, num_stages, micro_batches, virtual)
    warmup = interleaved_warmup(rank, num_stages, micro_batches, virtual)
    steady = micro_batches * virtual - warmup
    steps = [[a] for a in actions[:warmup]]
    steps += [actions[warmup + 2 * i: warmup + 2 * i + 2] for i in range(steady)]
    steps += [[a] for a in actions[warmup + 2 * steady:]]
    return steps


def _step(pipe: Pipe, actions: Sequence[tuple[str, int, int]]) -> None:
    """Ask for every input of ``actions``, run their computes, then ask for every output to be sent: the
    receives of this step go out with the sends of the previous one, in one batch."""
    inputs = [pipe.recv_forward(mb, c) if kind == "F" else pipe.recv_backward(mb, c) for kind, mb, c in actions]
    outputs = [pipe.forward_compute(mb, x, c) if kind == "F" else pipe.backward_compute(mb, x, c)
               for (kind, mb, c), x in zip(actions, inputs)]
    for (kind, mb, c), y in zip(actions, outputs):
        (pipe.send_forward if kind == "F" else pipe.send_backward)(mb, y, c)


def interleaved_step(pipe: Pipe) -> None:
    """Interleaved 1F1B over this rank's chunks (see :func:`interleaved_actions`), step by step
    (:func:`interleaved_steps`). In the steady state both receives of a step are asked for before its two
    computes: they go out with the previous step's two sends, four transfers in one batch (Megatron-LM's
    ``send_forward_backward_recv_forward_backward``). One forward then one backward, each with its own
    transfers, would deadlock on NCCL: the ranks form a ring, and a rank whose next forward needs no
    receive would post its gradient send alone."""
    for step in interleaved_steps(pipe.rank, pipe.world_size, pipe.micro_batches, len(pipe.chunks)):
        _step(pipe, step)


SCHEDULES: dict[str, Callable[[Pipe], None]] = {"naive": naive_step, "afab": afab_step, "1f1b": one_f_one_b_step,
                                                "interleaved": interleaved_step}


def train_step(pipe: Pipe, schedule: str | Callable[[Pipe], None]) -> StepStats:
    """``pipe.reset()``, run one schedule, ``pipe.finish()``. Call ``optimizer.step()`` after it."""
    fn = SCHEDULES.get(schedule) if isinstance(schedule, str) else schedule
    if fn is None:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    pipe.reset()
    fn(pipe)
    return pipe.finish()


# ----------------------------------------------------------------------------------------------------
# Analysis: gather, bubble, Gantt
# ----------------------------------------------------------------------------------------------------
def gather_stats(stats: StepStats) -> list[dict] | None:
    """Every rank's stats as dicts on rank 0 (None elsewhere); the stats themselves without a process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [stats.as_dict()]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(stats.as_dict(), out, dst=0)
    return out


def bubble_theory(num_stages: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle fraction of an ideal pipeline (equal stages, free transfers): ``(p-1) / (v*m + p-1)``."""
    return (num_stages - 1) / (virtual * micro_batches + num_stages - 1)


def _events(per_rank: Sequence[dict | StepStats]) -> list[list[dict]]:
    out = []
    for r in per_rank:
        evs = r.events if isinstance(r, StepStats) else r["events"]
        out.append([dataclasses.asdict(e) if isinstance(e, Event) else dict(e) for e in evs])
    return out


def bubble_fraction(per_rank: Sequence[dict | StepStats]) -> dict[str, Any]:
    """Measured idle fraction: each rank's idle time inside the step's span (first start to last end over all
    ranks) divided by the span, averaged over ranks. Also returns per-rank busy / idle seconds."""
    events = _events(per_rank)
    starts = [e["start"] for evs in events for e in evs]
    ends = [e["end"] for evs in events for e in evs]
    if not starts:
        raise ValueError("no events to measure: run a schedule first")
    span = max(ends) - min(starts)
    busy = [sum(e["end"] - e["start"] for e in evs) for evs in events]
    idle = [span - b for b in busy]
    return {"span_s": span, "busy_s": busy, "idle_s": idle, "bubble": sum(idle) / (span * len(events))}


def gantt(per_rank: Sequence[dict | StepStats], *, title: str = "Pipeline schedule", ax=None, path=None):
    """One row per rank, one box per compute event: forwards blue, backwards green, labelled with the micro-batch
    (and chunk letter for interleaved schedules). Returns the figure."""
    import matplotlib.pyplot as plt

    events = _events(per_rank)
    t0 = min(e["start"] for evs in events for e in evs)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.5 * len(events) + 1.2))
    colors = {"F": ["#4c72b0", "#8fb0e0", "#27466e"], "B": ["#55a868", "#9ad3a8", "#2f6b3d"]}
    for r, evs in enumerate(events):
        for e in evs:
            chunk = int(e.get("chunk", 0))
            col = colors[e["kind"]][chunk % 3]
            w = (e["end"] - e["start"]) * 1e3
            ax.barh(r, w, left=(e["start"] - t0) * 1e3, color=col, edgecolor="white", height=0.8)
            label = f"{e['mb']}" + ("abc"[chunk % 3] if any(x.get("chunk", 0) for x in evs) else "")
            ax.text((e["start"] - t0) * 1e3 + w / 2, r, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(events)), [f"rank {r}" for r in range(len(events))])
    ax.invert_yaxis()
    ax.set_xlabel("time since the step began (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors["F"][0], label="forward"), Patch(color=colors["B"][0], label="backward")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig = fig or ax.figure
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


__all__ = ["SCHEDULE_NAMES", "micro_batch_size", "check_world_size", "split_layers", "Stage", "split_model",
           "build_stage", "build_chunks", "Event", "StepStats", "Pipe", "naive_step", "afab_step",
           "one_f_one_b_actions", "one_f_one_b_step", "interleaved_warmup", "interleaved_actions", "interleaved_steps",
           "interleaved_step", "SCHEDULES", "Transfer",
           "train_step", "gather_stats", "bubble_theory", "bubble_fraction", "gantt"]
