"""3D parallelism, PP × TP × DP: one training step of :class:`dlo.models.llama.Llama` on a ``dp × pp × tp`` grid.

The pieces already exist; this module only puts them together:

* :class:`dlo.runtime.Grid` places the ranks (tp innermost, dp outermost) and creates the groups;
* each **pipeline stage** is a **tensor-parallel group**: the ``tp`` ranks of one pp coordinate hold the
  slices (:mod:`dlo.parallel.tensor`) of that stage's decoder blocks, the first stage also the
  vocab-parallel embedding, the last the final norm, the column-parallel LM head and the vocab-parallel loss
  (:class:`TPStage`, a :class:`~dlo.parallel.pipeline.Stage` whose blocks are tensor-parallel);
* the **schedule** (:mod:`dlo.parallel.pipeline`: afab, 1f1b, interleaved) sends activations and gradients
  between the ranks of the same tp coordinate on neighbouring stages: the peers come from the Grid's pp group
  (``Pipe(group=...)``), not from ``rank ± 1``;
* after the schedule, every gradient is averaged over the Grid's dp group (one flat all-reduce,
  :func:`dlo.parallel.tensor.all_reduce_gradients`); each replica worked on its own slice of the batch.

Every transfer is counted by :data:`dlo.parallel.comm.COUNTER` under a phase that names its axis: the TP
collectives under "forward" / "backward" (as in :mod:`dlo.parallel.tensor`), the pipeline's sends and
receives under "pp" (:class:`GridPipe`), the gradient all-reduce under "dp". :func:`comm_theory` predicts
those counts, call by call and byte by byte, for any rank of any layout (tests assert equality), and
:func:`param_count` the parameters each rank holds.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dlo.runtime.grid import Grid
from dlo.models.config import TransformerConfig
from dlo.models.llama import Llama
from dlo.parallel import comm
from dlo.parallel.pipeline import Pipe, Stage, interleaved_actions, micro_batch_size, split_layers, train_step
from dlo.parallel.tensor import (ColumnParallelLinear, TPDecoderBlock, VocabParallelEmbedding, all_reduce_gradients,
                                 full_tensors, vocab_parallel_cross_entropy)

SCHEDULES = ("afab", "1f1b", "interleaved")
AXIS_PHASES = {"tp": ("forward", "backward"), "pp": ("pp",), "dp": ("dp",)}
"""The counter phases of each axis' communication."""


# ----------------------------------------------------------------------------------------------------
# A pipeline stage made of tensor-parallel pieces
# ----------------------------------------------------------------------------------------------------
class _TPPieces:
    """What :class:`Stage` reads from a model, sliced for this tp rank: only the pieces the stage keeps are
    built (a rank never holds the slices of the other stages' layers)."""

    def __init__(self, full: Llama, layers: range, *, first: bool, last: bool, group: Any) -> None:
        self.cfg, self.rope_theta = full.cfg, full.rope_theta
        self.layers = {i: TPDecoderBlock(full.layers[i], group) for i in layers}
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group) if first else None
        self.norm = copy.deepcopy(full.norm) if last else None  # replicated: full on every tp rank
        self.lm_head = ColumnParallelLinear(full.lm_head, group) if last else None  # logits stay split by vocab
        if full.cfg.tie_embeddings and first and last:
            self.lm_head.weight = self.embed_tokens.weight  # same vocabulary slice on both sides


class TPStage(Stage):
    """Stage ``index`` of ``num_stages`` of ``full``, its blocks tensor-parallel over ``group`` (the Grid's tp
    group): parameter names are the model's, each parameter is this rank's slice (``tp_split_dim`` says
    along which dimension; :func:`dlo.parallel.tensor.full_tensors` gathers them). On the last stage
    ``forward`` returns this rank's slice of the logits and :meth:`loss` is the vocab-parallel cross-entropy:
    the ``[tokens, vocab]`` matrix is never gathered."""

    def __init__(self, full: Llama, layers: range, *, index: int, num_stages: int, group: Any = None) -> None:
        if full.cfg.tie_embeddings and num_stages > 1:
            raise ValueError("tied embeddings live on the first and the last stage at once (their gradients would "
                             "need an extra all-reduce between them): build the model with tie_embeddings=False")
        pieces = _TPPieces(full, layers, first=index == 0, last=index == num_stages - 1, group=group)
        super().__init__(pieces, layers, index=index, num_stages=num_stages)
        self.group = group

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return vocab_parallel_cross_entropy(logits, labels, self.group)


def build_grid_chunks(full: Llama, pp_index: int, pp: int, *, virtual: int = 1, tp_group: Any = None) -> list[TPStage]:
    """The chunk(s) that pipeline rank ``pp_index`` runs: the model is cut into ``pp * virtual`` stages of
    consecutive layers; this rank holds stages ``pp_index, pp_index + pp, ...`` (one when ``virtual == 1``),
    tensor-parallel over ``tp_group``."""
    if virtual < 1:
        raise ValueError(f"virtual stages per rank must be >= 1, got {virtual}")
    total = pp * virtual
    ranges = split_layers(full.cfg.num_layers, total)
    return [TPStage(full, ranges[k], index=k, num_stages=total, group=tp_group)
            for k in range(pp_index, total, pp)]


class GridPipe(Pipe):
    """A :class:`~dlo.parallel.pipeline.Pipe` that counts its transfers in :data:`dlo.parallel.comm.COUNTER`
    (op "send" or "recv", phase "pp", the bytes of each tensor) and notes the job-wide ranks it exchanged
    with since the last :meth:`reset` (``peers``: with ``group=`` the Grid's pp group, the ranks of the same
    dp and tp coordinates on the neighbouring stages)."""

    def reset(self) -> None:
        self.peers: set[int] = set()
        super().reset()

    def _post(self, ops):
        for op in ops:
            comm.COUNTER.add(op.kind, "pp", op.tensor.numel() * op.tensor.element_size())
            self.peers.add(self._global(op.peer))
        return super()._post(ops)


def replica_batch(batch: tuple[torch.Tensor, torch.Tensor], dp: int, dp_index: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel replica ``dp_index``'s equal share (consecutive rows) of the global batch."""
    ids, labels = batch
    n = micro_batch_size(ids.shape[0], dp)  # the same one-line error when dp does not divide the batch
    return ids[dp_index * n:(dp_index + 1) * n], labels[dp_index * n:(dp_index + 1) * n]


def grid_train_step(pipe: Pipe, schedule: str, chunks: Sequence[nn.Module], dp_group: Any = None):
    """One step on the grid: the pipeline schedule (TP collectives inside every block, P2P between stages),
    then the gradients averaged over ``dp_group``. Returns the Pipe's :class:`StepStats` (its loss is this
    replica's; average it over dp for the global batch's). Call ``optimizer.step()`` after it."""
    stats = train_step(pipe, schedule)
    all_reduce_gradients(nn.ModuleList(chunks), dp_group)  # phase "dp"
    return stats


def gathered_tensors(chunks: Sequence[nn.Module], tp_group: Any = None, *, grads: bool = False
                     ) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of this rank's chunks (slices gathered over the tp group; not counted)."""
    out: dict[str, torch.Tensor] = {}
    for chunk in chunks:
        out.update(full_tensors(chunk, tp_group, grads=grads))
    return out


# ----------------------------------------------------------------------------------------------------
# Checks and theory
# ----------------------------------------------------------------------------------------------------
def why_invalid(cfg: TransformerConfig, *, world_size: int, dp: int, pp: int, tp: int, batch: int,
                micro_batches: int, schedule: str = "1f1b", virtual: int = 1) -> str | None:
    """Why this layout cannot run (one line), or None: the same checks that would stop the run, done before
    any process starts."""
    if schedule not in SCHEDULES:
        return f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}"
    v = virtual if schedule == "interleaved" else 1
    try:
        Grid(world_size, dp=dp, pp=pp, tp=tp)
        for what in ("num_heads", "num_kv_heads", "vocab_size", "intermediate_size"):
            n = getattr(cfg, what)
            if n % tp:
                return f"tp={tp} does not divide {what}={n}"
        if cfg.tie_embeddings and pp * v > 1:
            return "tied embeddings cannot be split over pipeline stages: use tie_embeddings=False"
        split_layers(cfg.num_layers, pp * v)
        if batch % dp:
            return f"dp={dp} does not divide the batch of {batch} sequences"
        micro_batch_size(batch // dp, micro_batches)
        if schedule == "interleaved":
            interleaved_actions(0, pp, micro_batches, v)
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None


def _stage_layout(cfg: TransformerConfig, pp: int, pp_index: int, virtual: int) -> list[tuple[range, bool, bool, int]]:
    total = pp * virtual
    ranges = split_layers(cfg.num_layers, total)
    return [(ranges[k], k == 0, k == total - 1, k) for k in range(pp_index, total, pp)]


def param_count(cfg: TransformerConfig, *, pp: int = 1, tp: int = 1, pp_index: int = 0, virtual: int = 1) -> int:
    """Parameters held by a rank at pipeline coordinate ``pp_index`` (its slices; norms are whole)."""
    h, hd = cfg.hidden_size, cfg.head_dim
    block = (h * cfg.num_heads * hd * 2 + h * cfg.num_kv_heads * hd * 2 + 3 * h * cfg.intermediate_size) // tp + 2 * h
    total = 0
    for layers, first, last, _ in _stage_layout(cfg, pp, pp_index, virtual):
        total += block * len(layers)
        total += cfg.vocab_size // tp * h if first else 0
        if last:
            total += h + (0 if cfg.tie_embeddings and first else cfg.vocab_size // tp * h)
    return total


def comm_theory(cfg: TransformerConfig, grid: Grid, rank: int, *, batch: int, seq: int, micro_batches: int,
                virtual: int = 1, dtype_bytes: int = 4) -> dict[tuple[str, str], dict[str, int]]:
    """The communication of one training step for ``rank`` of ``grid``, as :meth:`CommCounter.summary` gives it:
    ``{(op, phase): {"calls", "bytes"}}`` (bytes of the model dtype, ``dtype_bytes`` each; the loss's
    per-token numbers are fp32).

    Per micro-batch ``[b, s]`` (``b = batch / dp / m``) and per chunk this rank holds, with ``L`` layers:

    * **tp** (when tp > 1): forward ``2L`` all-reduces of ``[b, s, hidden]`` (attention and MLP "g"),
      + 1 on the first stage (embedding), + on the last stage one all-reduce MAX of ``[b, s]`` and one of the
      two sums ``[2, b, s]`` (vocab-parallel loss); backward ``2L`` ("f" before attention and MLP) + 1 on the
      last stage ("f" before the LM head);
    * **pp**: one send and one receive of ``[b, s, hidden]`` per neighbouring stage on another rank: the
      activation forward, its gradient backward;
    * **dp** (when dp > 1): one all-reduce of every gradient of this rank, once per step.
    """
    where = grid.coords(rank)
    pp, tp, dp, r = grid.pp, grid.tp, grid.dp, where["pp"]
    mbs = micro_batch_size(micro_batch_size(batch, dp), micro_batches)
    act = mbs * seq * cfg.hidden_size * dtype_bytes
    token = mbs * seq * 4
    out: dict[tuple[str, str], list[int]] = {}

    def add(op: str, phase: str, calls: int, nbytes: int) -> None:
        if calls:
            entry = out.setdefault((op, phase), [0, 0])
            entry[0] += calls
            entry[1] += calls * nbytes

    m = micro_batches
    total = pp * virtual
    for layers, first, last, k in _stage_layout(cfg, pp, r, virtual):
        if tp > 1:
            n = len(layers)
            add("all_reduce", "forward", m * (2 * n + int(first)), act)
            add("all_reduce", "backward", m * (2 * n + int(last)), act)
            if last:
                add("all_reduce", "forward", m, 2 * token)
                add("all_reduce_max", "forward", m, token)
        if k + 1 < total and (k + 1) % pp != r:  # the next stage lives on another rank
            add("send", "pp", m, act)  # activations
            add("recv", "pp", m, act)  # their gradients
        if k > 0 and (k - 1) % pp != r:
            add("recv", "pp", m, act)
            add("send", "pp", m, act)
    if dp > 1:
        add("all_reduce", "dp", 1, param_count(cfg, pp=pp, tp=tp, pp_index=r, virtual=virtual) * dtype_bytes)
    return {key: {"calls": c, "bytes": b} for key, (c, b) in sorted(out.items())}


def by_axis(summary: dict[tuple[str, str], dict[str, int]]) -> dict[str, dict[str, int]]:
    """A counter summary (or :func:`comm_theory`) folded per axis:
    ``{"tp": {"calls", "bytes"}, "pp": ..., "dp": ...}``."""
    out = {axis: {"calls": 0, "bytes": 0} for axis in AXIS_PHASES}
    for (_, phase), v in summary.items():
        for axis, phases in AXIS_PHASES.items():
            if phase in phases:
                out[axis]["calls"] += v["calls"]
                out[axis]["bytes"] += v["bytes"]
    return out


__all__ = ["SCHEDULES", "AXIS_PHASES", "TPStage", "build_grid_chunks", "GridPipe", "replica_batch", "grid_train_step",
           "gathered_tensors", "why_invalid", "param_count", "comm_theory", "by_axis"]
