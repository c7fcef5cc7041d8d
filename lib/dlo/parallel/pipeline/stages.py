"""Cutting a Llama into pipeline stages: how many layers each stage gets (balanced by layer count or by
parameters), the :class:`Stage` module one rank runs, and the one-line checks of a pipeline's sizes."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from dlo.models.llama import Llama, lm_loss, rotary_cos_sin


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
