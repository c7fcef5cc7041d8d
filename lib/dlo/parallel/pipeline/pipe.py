"""The :class:`Pipe`: one rank's building blocks for writing a schedule (receive, compute, send), its
transfers posted together in one ``batch_isend_irecv`` before each compute (NCCL-safe, see the package
docstring), and the event log a step leaves (:class:`Event`, :class:`StepStats`)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dlo.parallel.pipeline.stages import Stage, micro_batch_size


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

    ``group``: the process group of this pipeline's stages when the job runs several pipelines side by side
    (a ``dp × pp × tp`` grid: the Grid's pp group). ``rank`` and ``world_size`` are then this rank's index in
    that group and its size; the neighbours are the group's ranks, not ``rank ± 1`` of the whole job. None: the
    pipeline is the whole job.
    """

    def __init__(self, stages: Stage | Sequence[Stage], batch: tuple[torch.Tensor, torch.Tensor], micro_batches: int,
                 *, rank: int = 0, world_size: int = 1, blocking: bool = False, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, group: Any = None) -> None:
        self.group = group
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
            dist.barrier(group=self.group)
        self.t0 = time.perf_counter()

    def _collectives(self) -> bool:
        """Whether this Pipe talks to other processes (a process group of more than one rank)."""
        return dist.is_available() and dist.is_initialized() and self.world_size > 1

    def _global(self, peer: int) -> int:
        """The job-wide rank of stage-rank ``peer`` (the same number when the pipeline is the whole job)."""
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

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
        return dist.batch_isend_irecv([dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, op.tensor,
                                                  self._global(op.peer), group=self.group, tag=op.tag) for op in ops])

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
            dist.broadcast(t, src=self._global(last_rank), group=self.group)
            loss = float(t.item())
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
        return StepStats(self.rank, loss, list(self.events), self.max_in_flight, self.peak_activation_bytes, peak,
                         step_s)
