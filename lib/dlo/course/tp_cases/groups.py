"""Balises 9-11 on real peers: the TP and DP groups (which ``dist.new_group`` calls every rank makes, in which
order, and which group it keeps) and TP combined with DP (gradients and metrics averaged over the DP group only).
"""
import contextlib

import torch
import torch.distributed as dist

from dlo.course.tp_cases import CFG, _grads_vs_reference, close, expect
from dlo.models.llama import Llama, token_batch


class _Group:
    """What the spy below returns instead of a process group: the ranks it was asked for."""

    def __init__(self, ranks):
        self.ranks = list(ranks)


@contextlib.contextmanager
def _recording_new_group():
    """dist.new_group replaced by a recorder (no group is really made, so that a wrong sequence of calls cannot
    leave the ranks waiting for each other): yields the list of rank lists asked for, in order."""
    from torch.distributed import distributed_c10d as c10d

    calls: list[list[int]] = []

    def fake(ranks=None, *args, **kwargs):
        grp = _Group(range(dist.get_world_size()) if ranks is None else sorted(int(x) for x in ranks))
        calls.append(grp.ranks)
        return grp

    saved = dist.new_group, c10d.new_group
    dist.new_group = c10d.new_group = fake
    try:
        yield calls
    finally:
        dist.new_group, c10d.new_group = saved


def _check_groups(fn, args, label, want, kind):
    """``fn(*args)`` must call new_group for every group of ``want`` on every rank, in one order shared by all
    ranks, and return this rank's group."""
    rank = dist.get_rank()
    with _recording_new_group() as calls:
        got = fn(*args)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, calls)
    if all(not c for c in everyone) and got is not None and not isinstance(got, _Group):
        # real groups, made through a name bound before the spy (from torch.distributed import new_group): only
        # the group returned can be checked
        calls, everyone = want, [want] * len(everyone)
    expect(sorted(calls) == sorted(want) or not set(map(tuple, calls)) < set(map(tuple, want)),
           f"{label}: rank {rank} created only {calls}: call dist.new_group for every {kind} group {want} on every "
           "rank, also for the groups it is not in (new_group is collective)")
    expect(sorted(calls) == sorted(want), f"{label} on 4 processes created the groups {calls}, expected {want}")
    expect(all(c == everyone[0] for c in everyone), f"{label}: the ranks created the groups in different orders "
           f"({everyone[0]} on rank 0, {calls} on rank {rank}): every rank must make the same calls in the same order")
    ranks = got.ranks if isinstance(got, _Group) else (dist.get_process_group_ranks(got) if got is not None else None)
    mine = next(grp for grp in want if rank in grp)
    expect(ranks == mine, f"{label}: rank {rank} got the group {ranks}, expected {mine}: return the group this rank "
           "belongs to")


def check_9(ns, g):
    for tp in (2, 4, 1):
        want = [list(range(k * tp, (k + 1) * tp)) for k in range(4 // tp)]
        _check_groups(ns["make_tp_group"], (tp,), f"make_tp_group(tp={tp})", want, "TP")


def check_10(ns, g):
    for tp, dp in ((2, 2), (4, 1), (1, 4)):
        want = [list(range(i, 4, tp)) for i in range(tp)]
        _check_groups(ns["make_dp_group"], (tp, dp), f"make_dp_group(tp={tp}, dp={dp})", want, "DP")


def check_11(ns, g):
    ids, labels = token_batch(4, 8, CFG.vocab_size, seed=2)
    rows = slice(2 * g["dp_rank"], 2 * g["dp_rank"] + 2)
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
    loss = model.loss(ids[rows], labels[rows])
    loss.backward()
    before = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dp_sum, tp_sum, world_sum = before.clone(), before.clone(), before.clone()
    dist.all_reduce(dp_sum, group=g["dp_group"])
    dist.all_reduce(tp_sum, group=g["tp_group"])
    dist.all_reduce(world_sum)
    ns["average_gradients"](model, g["dp_group"])
    after = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    named = ((dp_sum, "summed over the DP group but not divided by its size"),
             (dp_sum / 4, "divided twice by the DP group size"),
             (before, "left as they were (each replica keeps its own)"),
             (world_sum / 2, "summed over every rank: reduce over dp_group only"),
             (world_sum / 4, "averaged over every rank: reduce over dp_group only"),
             (tp_sum / 2, "averaged over the TP group (its ranks hold different slices): reduce over dp_group"))
    why = next((words for want, words in named if close(after, want, 1e-6)), None)
    expect(close(after, dp_sum / 2, 1e-6) or why is None, f"average_gradients: the gradients were {why}")
    _grads_vs_reference(ns, g["tp_group"], model, loss, ids, labels, rows)
    metric = ns["reduce_over_dp"](torch.tensor(float(g["dp_rank"] + 1)), torch.tensor(2.0), g["dp_group"])
    expect(abs(float(metric) - 3 / 4) < 1e-9, f"reduce_over_dp: expected (1 + 2) / (2 + 2) = 0.75 over the DP group only, "
           f"got {metric} (sum over dp_group, not over all ranks)")
    # Numbers that differ on every rank: a sum over all ranks (or over the TP group) no longer gives the same ratio
    # (with identical numbers on the TP ranks it would, as each would be counted tp times above and below)
    rank = dist.get_rank()
    members = [rank - rank % 2, rank - rank % 2 + 1]  # this rank's DP group, {0, 1} or {2, 3}
    metric = ns["reduce_over_dp"](torch.tensor(float(rank + 1)), torch.tensor(float(3 * rank + 2)), g["dp_group"])
    want = sum(m + 1 for m in members) / sum(3 * m + 2 for m in members)
    means = sum((m + 1) / (3 * m + 2) for m in members) / len(members)
    hint = (": that is the mean of the replicas' means -- sum loss_sum and count over dp_group, then divide once"
            if abs(float(metric) - means) < 1e-9 else ": reduce over dp_group, not over all ranks")
    expect(abs(float(metric) - want) < 1e-9, f"reduce_over_dp: with different numbers on every rank expected {want:.4f} "
           f"(sums over the DP group only), got {metric}" + hint)
