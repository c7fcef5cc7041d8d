"""Mixture of experts from scratch: top-k routing, capacity, the load-balancing loss, expert parallelism.

A *mixture-of-experts* (MoE) feed-forward replaces the one MLP of a transformer block by ``E`` MLPs (the
**experts**) and a **router**: each token goes through only ``k`` of them (``k = 1`` or ``2``). The
parameters grow ``E`` times, the FLOPs per token only ``k`` times: more capacity for the same compute.

**Routing** (:meth:`MoEFeedForward.route`): ``probs = softmax(x @ W_router)`` over the ``E`` experts, the
``k`` largest kept. Their weights are **renormalised** to sum to 1 over the ``k`` choices, as Mixtral does
(``renormalize=True``). With ``k = 1`` that weight is always 1 and the router would learn from the
load-balancing loss only, so the default (``renormalize=None``) renormalises for ``k > 1`` and keeps the raw
probability for ``k = 1`` (Switch Transformer's choice). The output of a token is ``Σ_j w_j · expert_j(x)``.

**Capacity** (GShard, Switch Transformer): with ``capacity_factor = c`` each expert takes at most
``C = ceil(c · k · n / E)`` of the ``n`` tokens of a **group** (a batch of tokens processed together: in
expert parallelism, the tokens of one rank). The routing decisions of a group are served in priority order:
every token's first choice (in token order), then every second choice, and so on; a decision that finds its
expert full is **dropped**: it adds nothing, and a token whose every choice was dropped comes out of the
block as its residual only (the MoE adds zero). The weights of the kept choices are not renormalised again.
``capacity_factor=None``: no limit, nothing dropped.

**Load-balancing loss** (:func:`load_balancing_loss`, Switch Transformer): ``E · Σ_e f_e · P_e`` with
``f_e`` the fraction of the ``n · k`` routing decisions that chose expert ``e`` (counted before the
capacity, over all ``k`` choices) and ``P_e`` the mean router probability of ``e`` over the tokens. It is 1
when the routing is uniform and ``E`` when every token goes to one expert with probability 1. ``f`` counts
decisions and carries no gradient; the gradient reaches the router through ``P``. (transformers' Mixtral
divides the counts by ``n`` instead of ``n · k``: the same loss times ``k``, a constant the coefficient absorbs.)

**Statistics** (``.stats`` after each forward): tokens routed to each expert (decisions before the
capacity), kept per expert, dropped decisions, tokens dropped entirely, ``imbalance = max / mean`` of the
routed counts (1 is perfect balance), the capacity.

**Expert parallelism** (:class:`ExpertParallelMoE`): the ``E`` experts are split over the ``ep`` ranks of a
group (``E / ep`` consecutive experts each); the router is replicated; each rank routes its own tokens.
Then, with every rank taking the same steps in the same order (NCCL's rule; a rank with no token still
takes part, with empty tensors):

1. ``all_to_all_single`` of the **counts**: how many tokens this rank sends to each expert, so that every
   rank knows how many it will receive from each peer (the splits of the next exchange);
2. ``all_to_all_single`` of the **tokens** (dispatch), sorted by expert, with uneven splits;
3. each local expert runs on the tokens it received (every expert runs, even on an empty batch, so that its
   gradient exists on every rank);
4. ``all_to_all_single`` back (combine), the reverse splits; the weighted sum at home;
5. one ``all_reduce`` of the routing counts and the probability sums, for the loss and the statistics of the
   whole batch.

Backward runs the two token exchanges in reverse (one ``all_to_all_single`` each): 2 exchanges of tokens
forward, 2 backward, plus the counts. The capacity is applied per rank, before the dispatch (a rank's tokens
are its group), so expert parallelism over ``ep`` ranks equals :class:`MoEFeedForward` on the whole batch
with ``groups=ep`` (or the list of the ranks' token counts when they differ).

**Gradients across the group.** Write each rank's loss as its *share* of the whole batch's loss: the terms of
its own tokens, normalised by the whole group's token count (a sum over its tokens, or its mean times its
fraction of the batch), not by its own. The aux loss returned on each rank is such a share: the value of the
whole batch's loss, the gradient of this rank's tokens. Then:

* the experts' gradients are complete on the rank that holds them (the backward exchanges bring them the
  gradient of every rank's tokens): they are not reduced over the group (the other ranks hold other experts);
* the router (and in a model every other replicated weight: attention, norms, embeddings) holds on each rank
  the gradient of that rank's share only: **sum** it over the group, ``all_reduce`` with ``ReduceOp.SUM``
  (:func:`sum_replicated_grads` does it for every weight that is not an expert).

Not an averaging all-reduce: torch's DDP, :mod:`dlo.parallel.ddp`'s hook and ``reduce_mean`` **divide** the
sum by the world size, which leaves the router with ``1/ep`` of its gradient while the experts keep theirs
whole (and DDP over the whole model would average different experts together). DDP's own convention, each
rank's loss the mean of its own tokens, gives the same factor the other way round (equal batches): the router is
right, the experts' gradients are ``ep`` times too large. With data-parallel replicas of an expert-parallel
group (``world = dp · ep``, each replica its own batch), sum over the group first, then average the same weights
over the replicas, experts included.

:func:`moe_llama` swaps the MLP of every block of a :class:`dlo.models.llama.Llama` for a MoE (the dense
model is untouched unless it is called), and :func:`moe_aux_loss` adds up the blocks' aux losses.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from dlo.models.llama import SwiGLU


# ----------------------------------------------------------------------------------------------------
# Routing, capacity, loss
# ----------------------------------------------------------------------------------------------------
def load_balancing_loss(router_probs: torch.Tensor, expert_index: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E · Σ_e f_e · P_e`` (see the module docstring).

    ``router_probs``: ``[n, E]``, the softmax of the router; ``expert_index``: ``[n, k]``, the experts chosen.
    ``f_e``: the fraction of the ``n · k`` decisions that chose ``e``; ``P_e``: ``router_probs.mean(0)[e]``."""
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / max(1, expert_index.numel())
    return num_experts * (f * router_probs.mean(0)).sum()


def group_sizes(n: int, groups: int | Sequence[int]) -> list[int]:
    """Sizes of ``groups`` consecutive groups of ``n`` tokens (the first ones one larger when uneven). A list of
    sizes (one per rank, zeros allowed, summing to ``n``) is returned as it is: ranks with uneven batches."""
    if isinstance(groups, (list, tuple)):
        sizes = list(groups)
        if not sizes or not all(isinstance(s, int) and s >= 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"group sizes must be non-negative integers summing to the {n} tokens, got {groups!r}")
        return sizes
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    return [n // groups + (1 if g < n % groups else 0) for g in range(groups)]


def capacity(n: int, num_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """Tokens one expert takes from a group of ``n``: ``ceil(capacity_factor · k · n / E)``; None: no limit."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * top_k * n / num_experts - 1e-9)


def keep_mask(expert_index: torch.Tensor, num_experts: int, cap: int | None) -> torch.Tensor:
    """``[n, k]`` bool: which decisions of one group fit in their expert's capacity. Priority: all first choices
    in token order, then all second choices, and so on."""
    if cap is None or expert_index.numel() == 0:
        return torch.ones_like(expert_index, dtype=torch.bool)
    order = expert_index.t().reshape(-1)  # choice-major: every first choice, then every second choice
    one_hot = torch.nn.functional.one_hot(order, num_experts)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # the decision's place in its expert's queue
    return (position < cap).reshape(expert_index.shape[1], -1).t()


def top_k_routing(probs: torch.Tensor, top_k: int, cap: int | None = None,
                  renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-choice routing of one group: ``(expert_index [n, k], weights [n, k], keep [n, k])``.

    Each token's ``k`` largest probabilities, in decreasing order; equal probabilities go to the lower expert
    index first (a stable sort: the same answer on every run and every device). ``weights``: those
    probabilities, renormalised to sum to 1 over the ``k`` choices (``renormalize=False``: as they are),
    differentiable. ``keep``: which decisions fit in their expert's capacity ``cap`` (:func:`keep_mask`: every
    first choice in token order, then every second choice ...; ``None``: all). The weights of the kept choices
    are not renormalised again."""
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    index, top = order.indices[..., :top_k], order.values[..., :top_k]
    weights = top / top.sum(-1, keepdim=True) if renormalize else top
    return index, weights, keep_mask(index, probs.shape[-1], cap)


def _check_experts(num_experts: int, top_k: int) -> None:
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}")
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be between 1 and num_experts={num_experts}, got {top_k!r}")


class MoEFeedForward(nn.Module):
    """A top-k mixture of ``num_experts`` SwiGLU experts (shaped like :class:`dlo.models.llama.SwiGLU`), run in
    one process: the reference of :class:`ExpertParallelMoE`.

    ``forward(x)`` takes ``[..., hidden]`` and returns the same shape; after it, ``.aux_loss`` holds the
    load-balancing loss of the batch (differentiable) and ``.stats`` the routing statistics. ``groups``: the
    tokens (flattened in order) are cut into that many consecutive groups for the capacity (``groups=ep``
    reproduces expert parallelism over ``ep`` ranks with as many tokens each; a list of sizes, ranks with uneven
    batches, a rank with none included). ``seed``: weights drawn like Llama's (normal, std
    ``init_std``), so that every process builds the same MoE."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int = 2, *,
                 capacity_factor: float | None = None, renormalize: bool | None = None, groups: int = 1,
                 seed: int | None = 0, init_std: float = 0.02) -> None:
        super().__init__()
        _check_experts(num_experts, top_k)
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be positive or None, got {capacity_factor!r}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.renormalize = top_k > 1 if renormalize is None else renormalize
        self.groups = groups
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden_size, intermediate_size) for _ in range(num_experts))
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, Any] = {}
        if seed is not None:
            self.reset_parameters(seed, init_std)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0, init_std: float = 0.02) -> None:
        gen = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            p.copy_(torch.empty(p.shape).normal_(0.0, init_std, generator=gen))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(probs [n, E], expert_index [n, k], weights [n, k])`` of the tokens ``x [n, hidden]``."""
        probs = torch.softmax(self.router(x), dim=-1)
        index, weights, _ = top_k_routing(probs, self.top_k, None, self.renormalize)
        return probs, index, weights

    def _finish(self, probs_sum: torch.Tensor, counts: torch.Tensor, kept: torch.Tensor, dropped: int,
                dropped_tokens: int, n: int, cap: list[int | None]) -> None:
        e = self.num_experts
        f = counts.to(probs_sum.dtype) / max(1, n * self.top_k)
        self.aux_loss = e * (f * probs_sum / max(1, n)).sum()
        self.stats = _stats(counts, kept, dropped, dropped_tokens, n, cap)

    def forward(self, x: torch.Tensor, groups: int | Sequence[int] | None = None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n = x.shape[0]
        probs, index, weights = self.route(x)
        sizes = group_sizes(n, self.groups if groups is None else groups)
        caps = [capacity(s, self.num_experts, self.top_k, self.capacity_factor) for s in sizes]
        keep = torch.cat([keep_mask(part, self.num_experts, c) for part, c in zip(index.split(sizes), caps)])
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # gather the expert's tokens, run it, scatter back weighted
            token, choice = torch.nonzero((index == e) & keep, as_tuple=True)
            y = expert(x[token])
            out = out.index_add(0, token, y * weights[token, choice].unsqueeze(-1))
        counts = torch.bincount(index.reshape(-1), minlength=self.num_experts)
        kept = torch.bincount(index[keep], minlength=self.num_experts)
        self._finish(probs.sum(0), counts, kept, int((~keep).sum()), int((~keep).all(-1).sum()), n, caps)
        return out.reshape(shape)


def _stats(counts: torch.Tensor, kept: torch.Tensor, dropped: int, dropped_tokens: int, n: int,
           cap: list[int | None]) -> dict[str, Any]:
    routed = [int(c) for c in counts]
    mean = sum(routed) / len(routed)
    return {"tokens": n, "tokens_per_expert": routed, "kept_per_expert": [int(c) for c in kept],
            "dropped": dropped, "dropped_tokens": dropped_tokens,
            "imbalance": max(routed) / mean if mean else 1.0, "capacity": cap}


# ----------------------------------------------------------------------------------------------------
# Expert parallelism
# ----------------------------------------------------------------------------------------------------
def _group_info(group: Any) -> tuple[int, int]:
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def experts_of(rank: int, num_experts: int, ep: int) -> range:
    """The experts rank ``rank`` of an expert-parallel group of ``ep`` holds: ``E / ep`` consecutive ones."""
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts cannot be split evenly over ep={ep} ranks: choose ep dividing "
                         f"num_experts")
    per = num_experts // ep
    return range(rank * per, (rank + 1) * per)


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any, comm: dict | None,
              what: str) -> torch.Tensor:
    """One ``all_to_all_single``: ``x``'s rows cut by ``in_splits`` go to ranks 0, 1, ...; the rows received,
    ``out_splits`` from each rank, in rank order."""
    if dist.is_available() and dist.is_initialized():
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    else:  # one process, no process group: the exchange is a copy
        out = x.clone()
    if comm is not None:
        comm[what] = comm.get(what, 0) + 1
        row = math.prod(x.shape[1:]) * x.element_size()  # from the shape: x may have no row on this rank
        comm[f"{what}_bytes_sent"] = comm.get(f"{what}_bytes_sent", 0) + row * sum(in_splits)
    return out


class _AllToAll(torch.autograd.Function):
    """A differentiable token exchange: its backward is the exchange in the other direction."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, comm, phase):
        ctx.splits, ctx.group, ctx.comm, ctx.phase = (out_splits, in_splits), group, comm, phase
        return _exchange(x, out_splits, in_splits, group, comm, f"forward_{phase}")

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return (_exchange(grad, in_splits, out_splits, ctx.group, ctx.comm, f"backward_{ctx.phase}"),
                None, None, None, None, None)


def dispatch_combine(rows: torch.Tensor, expert: torch.Tensor, num_experts: int, run_local: Any,
                     group: Any = None, comm: dict | None = None) -> torch.Tensor:
    """Send each row to the rank holding its expert, run that rank's experts, and bring the results home.

    ``rows``: ``[m, ...]``, this rank's rows (one per kept routing decision), in any order; ``expert``: ``[m]``, the
    global expert of each row. ``run_local(received, local_expert)`` runs this rank's experts (:func:`experts_of`)
    on the rows it received (``local_expert`` in ``0 .. E/ep - 1``) and returns one output row per row. Returns the
    outputs ``[m, ...]`` in the order of ``rows``. Every rank makes the same three ``all_to_all_single`` calls
    (counts, dispatch, combine), with empty tensors when it has nothing to send or receive; differentiable in
    ``rows`` (the backward exchanges the gradients the other way)."""
    ep, _ = _group_info(group)
    per = len(experts_of(0, num_experts, ep))
    order = torch.argsort(expert, stable=True)  # grouped by expert, hence by destination rank
    send_counts = torch.bincount(expert, minlength=num_experts)  # [E]: to expert e (on rank e // per)
    # 1. the counts: recv_counts[s, j] = rows rank s sends to my local expert j
    recv_counts = _exchange(send_counts, [per] * ep, [per] * ep, group, comm, "counts").view(ep, per)
    in_splits, out_splits = send_counts.view(ep, per).sum(1).tolist(), recv_counts.sum(1).tolist()
    # 2. dispatch: the rows received come by source rank, each source's rows sorted by local expert
    received = _AllToAll.apply(rows[order], out_splits, in_splits, group, comm, "tokens")
    local_expert = torch.repeat_interleave(torch.arange(per, device=rows.device).repeat(ep), recv_counts.reshape(-1))
    # 3. the local experts, then 4. combine: the results go home in the order they left, then unsorted
    back = _AllToAll.apply(run_local(received, local_expert), in_splits, out_splits, group, comm, "tokens_back")
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return back[inverse]


class ExpertParallelMoE(nn.Module):
    """The experts of ``reference`` (a :class:`MoEFeedForward`) split over the ranks of ``group`` (``None``: the
    default group, or one process without any): this rank keeps a copy of the router and experts
    :func:`experts_of`. ``forward(x)`` takes this rank's tokens ``[..., hidden]``; ``.aux_loss``, ``.stats``
    (of the whole group's batch) and ``.comm`` after it: the exchanges made by phase, and the bytes each handed to
    ``all_to_all_single`` (the rows a rank keeps for itself included)."""

    def __init__(self, reference: MoEFeedForward, group: Any = None) -> None:
        super().__init__()
        self.group = group
        self.ep, self.rank = _group_info(group)
        self.local = experts_of(self.rank, reference.num_experts, self.ep)
        self.num_experts, self.top_k = reference.num_experts, reference.top_k
        self.capacity_factor, self.renormalize = reference.capacity_factor, reference.renormalize
        self.router = copy.deepcopy(reference.router)
        self.experts = nn.ModuleList(copy.deepcopy(reference.experts[e]) for e in self.local)
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, Any] = {}
        self.comm: dict[str, int] = {}

    route = MoEFeedForward.route

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n, e_all = x.shape[0], self.num_experts
        probs, index, weights = self.route(x)
        cap = capacity(n, e_all, self.top_k, self.capacity_factor)
        keep = keep_mask(index, e_all, cap)
        token, choice = torch.nonzero(keep, as_tuple=True)
        order = torch.argsort(index[token, choice], stable=True)  # by expert: the outputs are added in that order
        token, choice = token[order], choice[order]

        def run_local(received: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
            y = torch.zeros_like(received)  # every local expert runs, even on no row: its gradient exists
            for j, mlp in enumerate(self.experts):
                rows = torch.nonzero(local_expert == j, as_tuple=True)[0]
                y = y.index_copy(0, rows, mlp(received[rows]))
            return y

        back = dispatch_combine(x[token], index[token, choice], e_all, run_local, self.group, self.comm)
        out = torch.zeros_like(x).index_add(0, token, back * weights[token, choice].unsqueeze(-1))
        # 5. the whole batch's counts and mean probabilities, for the aux loss and the statistics
        probs_sum = probs.sum(0)
        kept = torch.bincount(index[keep], minlength=e_all)
        counts = torch.bincount(index.reshape(-1), minlength=e_all)
        local = torch.cat([counts.double(), kept.double(), probs_sum.detach().double(),
                           torch.tensor([float((~keep).sum()), float((~keep).all(-1).sum()), float(n)],
                                        dtype=torch.float64, device=x.device)])
        total = local.clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total, group=self.group)
            self.comm["all_reduce"] = self.comm.get("all_reduce", 0) + 1
        g_counts, g_kept, g_probs = total[:e_all], total[e_all:2 * e_all], total[2 * e_all:3 * e_all]
        dropped, dropped_tokens, n_all = (int(v) for v in total[3 * e_all:].round())
        f = g_counts.to(probs.dtype) / max(1, n_all * self.top_k)
        mine = e_all * (f * probs_sum / max(1, n_all)).sum()  # this rank's share, with its gradient
        whole = e_all * (f * g_probs.to(probs.dtype) / max(1, n_all)).sum()
        self.aux_loss = mine + (whole - mine.detach())  # the value of the whole batch, this rank's gradient
        caps = [cap]  # this rank's; every rank with as many tokens has the same
        self.stats = _stats(g_counts.round().long(), g_kept.round().long(), dropped, dropped_tokens, n_all, caps)
        return out.reshape(shape)


def sum_replicated_grads(model: nn.Module, group: Any = None) -> list[str]:
    """Sum over the expert-parallel ``group`` (``None``: the default group) the gradient of every parameter of
    ``model`` that is not an expert of an :class:`ExpertParallelMoE`: the routers, and in a model the other
    replicated weights. Each rank holds the gradient of its own share of the loss (see the module docstring);
    the sum is the whole batch's. The experts' gradients are left as they are: complete on their rank.

    One ``all_reduce`` (``ReduceOp.SUM``) per dtype, every rank calling it with the same parameters in the same
    order; a parameter with no gradient on this rank takes part as zeros (and gets the sum). Without a process
    group it changes nothing. Returns the names of the parameters summed."""
    experts = {id(p) for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()}
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad and id(p) not in experts]
    if dist.is_available() and dist.is_initialized():
        for dtype in dict.fromkeys(p.dtype for _, p in named):
            params = [p for _, p in named if p.dtype == dtype]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            with torch.no_grad():
                for p, g in zip(params, flat.split([p.numel() for p in params])):
                    if p.grad is None:
                        p.grad = g.view_as(p).clone()
                    else:
                        p.grad.copy_(g.view_as(p))
    return [name for name, _ in named]


def all_to_all_bytes(send_counts: list[list[int]], hidden_size: int, element_size: int,
                     include_self: bool = False) -> int:
    """Bytes of tokens one forward's dispatch moves between ranks: ``send_counts[s][d]`` tokens from rank ``s``
    to rank ``d``, each ``hidden_size`` elements. The combine moves as many back; the backward twice that
    again. ``include_self``: also count the rows a rank "sends" to itself (a copy, not a transfer)."""
    return sum(c for s, row in enumerate(send_counts) for d, c in enumerate(row) if include_self or s != d) \
        * hidden_size * element_size


# ----------------------------------------------------------------------------------------------------
# In a Llama
# ----------------------------------------------------------------------------------------------------
def moe_llama(model: nn.Module, num_experts: int, top_k: int = 2, *, capacity_factor: float | None = None,
              intermediate_size: int | None = None, renormalize: bool | None = None, groups: int = 1,
              seed: int = 0, ep_group: Any = None, expert_parallel: bool = False) -> nn.Module:
    """Replace the MLP of every decoder block of ``model`` (a :class:`dlo.models.llama.Llama`) by a MoE, in
    place, and return the model. Block ``i`` gets ``MoEFeedForward(..., seed=seed + i)``; with
    ``expert_parallel=True`` it is wrapped in :class:`ExpertParallelMoE` over ``ep_group`` (each rank then
    passes its own sequences). Attention, norms and embeddings are unchanged; a model never given to this
    function stays the dense Llama."""
    cfg = model.cfg
    for i, block in enumerate(model.layers):
        moe = MoEFeedForward(cfg.hidden_size, intermediate_size or cfg.intermediate_size, num_experts, top_k,
                             capacity_factor=capacity_factor, renormalize=renormalize, groups=groups, seed=seed + i)
        block.mlp = ExpertParallelMoE(moe, ep_group) if expert_parallel else moe
    return model


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the load-balancing losses of the model's MoE layers, from its last forward."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, (MoEFeedForward, ExpertParallelMoE))
              and m.aux_loss is not None]
    if not losses:
        raise ValueError("no MoE layer has run a forward yet: call moe_llama(model, ...) then model(tokens)")
    return torch.stack(losses).sum()


__all__ = [
    "load_balancing_loss", "group_sizes", "capacity", "keep_mask", "top_k_routing", "MoEFeedForward", "experts_of",
    "dispatch_combine", "ExpertParallelMoE", "sum_replicated_grads", "all_to_all_bytes", "moe_llama", "moe_aux_loss",
]
