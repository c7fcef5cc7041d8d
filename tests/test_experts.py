"""dlo.parallel.experts: the MoE against a per-token computation, the capacity, the load-balancing loss, expert
parallelism on several processes equal to one process.

One process: :class:`MoEFeedForward` against a naive loop over tokens and their choices (the capacity served in
its priority order by hand), top-1, top-2 and top-3, with and without dropped decisions, fp64 and fp32; the aux
loss against hand computations; the statistics; :func:`moe_llama` leaves the dense model alone. Then three
launches (:mod:`dlo.parallel.experts_worker`): 2 processes (ep=2, E=4 and E=6: three experts per rank), 3
processes (ep=3, E=6) and 4 processes as two expert-parallel groups of 2 (ep=2 inside each data-parallel
replica), each comparing outputs, aux loss, statistics and gradients with one process on the same global batch,
and counting the ``all_to_all_single`` calls of every forward and backward. Two more launches (2 and 3 processes)
put empty tensors in the exchanges, as a skewed router does in training: a rank with no token (it sends
nothing), a rank whose experts no token chooses (it receives nothing), both on one rank.
"""
from __future__ import annotations

import math

import pytest
import torch

import dlo  # noqa: F401
from dlo.models.config import TINY_LLAMA
from dlo.models.llama import Llama, token_batch
from dlo.parallel import experts as X
from dlo.parallel import experts_worker
from dlo.runtime.launch import launch_forked

distributed = pytest.mark.distributed
TOL = 1e-5  # fp32, expert-parallel against one process


# ----------------------------------------------------------------------------------------------------
# The reference against a per-token computation
# ----------------------------------------------------------------------------------------------------
def _naive(moe: X.MoEFeedForward, x: torch.Tensor, groups: int) -> tuple[torch.Tensor, int]:
    """Token by token: softmax, top-k, renormalise, the capacity served in priority order, weighted experts."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.zeros_like(flat)
    dropped = 0
    start = 0
    for size in X.group_sizes(flat.shape[0], groups):
        cap = math.inf if moe.capacity_factor is None else \
            math.ceil(moe.capacity_factor * moe.top_k * size / moe.num_experts - 1e-9)
        choices = []
        for t in range(start, start + size):
            probs = torch.softmax(moe.router.weight @ flat[t], -1)
            top = sorted(range(moe.num_experts), key=lambda e: -float(probs[e]))[:moe.top_k]
            weights = [probs[e] for e in top]
            if moe.renormalize:
                total = sum(weights)
                weights = [w / total for w in weights]
            choices.append((t, top, weights))
        load = [0] * moe.num_experts
        for j in range(moe.top_k):  # every first choice, then every second choice ...
            for t, top, weights in choices:
                e = top[j]
                if load[e] >= cap:
                    dropped += 1
                    continue
                load[e] += 1
                out[t] += weights[j] * moe.experts[e](flat[t])
        start += size
    return out.reshape(x.shape), dropped


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-6)])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("capacity_factor, groups", [(None, 1), (1.0, 1), (0.6, 1), (1.0, 3)])
def test_reference_equals_a_per_token_computation(dtype, tol, top_k, capacity_factor, groups):
    moe = X.MoEFeedForward(12, 20, 5, top_k, capacity_factor=capacity_factor, seed=top_k).to(dtype)
    g = torch.Generator().manual_seed(top_k + 7)
    x = (torch.randn(3, 7, 12, generator=g, dtype=torch.float64) * 8).to(dtype)
    with torch.no_grad():
        got = moe(x, groups=groups)
        want, dropped = _naive(moe, x, groups)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    assert moe.stats["dropped"] == dropped
    if capacity_factor is None:
        assert dropped == 0 and moe.stats["capacity"] == [None]
    elif capacity_factor < 1 or top_k == 1:
        assert dropped > 0  # the case drops decisions: their tokens keep the other choices, or nothing
    stats = moe.stats
    assert sum(stats["tokens_per_expert"]) == 21 * top_k == sum(stats["kept_per_expert"]) + stats["dropped"]
    mean = sum(stats["tokens_per_expert"]) / 5
    assert stats["imbalance"] == pytest.approx(max(stats["tokens_per_expert"]) / mean)


def test_a_token_whose_every_choice_is_dropped_comes_out_as_zero():
    """In a block, x + moe(x): a fully dropped token keeps its residual only."""
    moe = X.MoEFeedForward(8, 8, 4, 1, capacity_factor=0.25, seed=0)  # capacity 1 per expert for 16 tokens
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    out = moe(x)
    assert moe.stats["capacity"] == [1] and moe.stats["dropped_tokens"] == moe.stats["dropped"] >= 12
    assert int((out.abs().sum(-1) == 0).sum()) == moe.stats["dropped_tokens"]


def test_capacity_and_priority_order():
    assert X.capacity(10, 4, 2, 1.0) == 5 and X.capacity(10, 4, 1, 1.25) == 4 and X.capacity(8, 4, 2, None) is None
    assert X.capacity(12, 4, 1, 1.0) == 3  # exact: no rounding up of 3.0000001
    index = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    # capacity 2: first choices of tokens 0 and 1 fill expert 0, token 2's first choice is dropped, token 3's goes
    # to expert 1; then second choices: token 0 -> 1 (kept, 2nd on 1), token 1 -> 2, token 2 -> 1 (full), token 3 -> 0
    assert X.keep_mask(index, 3, 2).tolist() == [[True, True], [True, True], [False, False], [True, False]]
    assert X.group_sizes(10, 3) == [4, 3, 3]
    with pytest.raises(ValueError, match="cannot be split evenly over ep=4"):
        X.experts_of(0, 6, 4)
    assert list(X.experts_of(2, 6, 3)) == [4, 5]
    with pytest.raises(ValueError, match="top_k must be between 1 and num_experts=4"):
        X.MoEFeedForward(4, 4, 4, 5)


def test_top_k_routing_breaks_ties_by_the_lower_index_and_renormalises():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.4, 0.1, 0.4, 0.1]],
                         dtype=torch.float64, requires_grad=True)
    index, weights, keep = X.top_k_routing(probs, 2, None)
    assert index.tolist() == [[0, 1], [1, 2], [0, 2]]
    torch.testing.assert_close(weights, torch.full((3, 2), 0.5, dtype=torch.float64))
    assert weights.grad_fn is not None and keep.all()
    raw = X.top_k_routing(probs, 2, None, renormalize=False)[1]
    torch.testing.assert_close(raw, torch.tensor([[0.25, 0.25], [0.3, 0.3], [0.4, 0.4]], dtype=torch.float64))
    # capacity 1, first choices first: 0 -> expert 0, 1 -> expert 1 kept, 2 -> expert 0 dropped; then second
    # choices: 0 -> expert 1 (full) dropped, 1 -> expert 2 kept, 2 -> expert 2 (full) dropped
    assert X.top_k_routing(probs, 2, 1)[2].tolist() == [[True, False], [True, True], [False, False]]


def test_dispatch_combine_in_one_process_returns_each_row_its_experts_output():
    g = torch.Generator().manual_seed(3)
    rows, expert = torch.randn(9, 4, generator=g, dtype=torch.float64), torch.tensor([2, 0, 3, 0, 1, 3, 2, 2, 0])
    seen = []

    def run_local(received, local_expert):
        seen.append(local_expert.tolist())
        return received * (local_expert.unsqueeze(-1) + 2) + 10 * local_expert.unsqueeze(-1)

    out = X.dispatch_combine(rows, expert, 4, run_local)
    torch.testing.assert_close(out, rows * (expert.unsqueeze(-1) + 2) + 10 * expert.unsqueeze(-1), rtol=0, atol=0)
    assert seen == [sorted(expert.tolist())]  # one call, the rows grouped by expert
    empty = X.dispatch_combine(rows[:0], expert[:0], 4, run_local)
    assert empty.shape == (0, 4) and seen[-1] == []


# ----------------------------------------------------------------------------------------------------
# The load-balancing loss
# ----------------------------------------------------------------------------------------------------
def test_load_balancing_loss_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], dtype=torch.float64)
    index = torch.tensor([[0], [0], [1], [0]])
    # f = (3/4, 1/4), P = (0.65, 0.35): 2 · (0.75 · 0.65 + 0.25 · 0.35) = 1.15
    assert float(X.load_balancing_loss(probs, index, 2)) == pytest.approx(1.15, abs=1e-12)
    # top-2 of 3 experts: 8 decisions, f = (3/8, 3/8, 2/8); uniform P = 1/3 gives exactly 1
    index2 = torch.tensor([[0, 1], [1, 2], [0, 2], [0, 1]])
    uniform = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    assert float(X.load_balancing_loss(uniform, index2, 3)) == pytest.approx(1.0, abs=1e-12)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).expand(4, 3)
    want = 3 * (3 / 8 * 0.5 + 3 / 8 * 0.3 + 2 / 8 * 0.2)
    assert float(X.load_balancing_loss(p, index2, 3)) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_e_when_every_token_goes_to_one_expert(top_k):
    e = 6
    moe = X.MoEFeedForward(4, 8, e, top_k, seed=0).double()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 200.0  # expert 0 gets probability 1 for every token with x[0] = 1
        if top_k == 2:
            moe.router.weight[1, 0] = 100.0  # and expert 1 the second choice, with probability ~0
    x = torch.zeros(9, 4, dtype=torch.float64)
    x[:, 0] = 1.0
    moe(x)
    # f_0 = 1/k (each token's first choice), P_0 = 1: E / k; top-1 gives E
    assert float(moe.aux_loss.detach()) == pytest.approx(e / top_k, abs=1e-9)
    assert moe.stats["tokens_per_expert"][0] == 9 and moe.stats["imbalance"] == pytest.approx(e / top_k)


def test_aux_loss_of_the_moe_is_the_function_on_its_routing():
    moe = X.MoEFeedForward(10, 16, 7, 2, capacity_factor=0.5, seed=1).double()
    x = torch.randn(2, 11, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    moe(x)
    probs, index, _ = moe.route(x.reshape(-1, 10))
    assert torch.allclose(moe.aux_loss, X.load_balancing_loss(probs, index, 7), rtol=0, atol=1e-12)
    assert moe.stats["dropped"] > 0  # the capacity does not change what the loss counts (decisions before it)
    grad = torch.autograd.grad(moe.aux_loss, moe.router.weight)[0]
    assert grad.abs().sum() > 0  # the router learns from it


# ----------------------------------------------------------------------------------------------------
# Expert parallelism in one process, and in a Llama
# ----------------------------------------------------------------------------------------------------
def test_expert_parallel_without_a_process_group_is_the_reference():
    ref = X.MoEFeedForward(8, 12, 4, 2, capacity_factor=0.75, seed=3).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    ep = X.ExpertParallelMoE(ref)
    assert ep.ep == 1 and list(ep.local) == [0, 1, 2, 3]
    out = ep(x)
    torch.testing.assert_close(out, ref(x), rtol=0, atol=1e-12)
    assert ep.stats == ref.stats and float(ep.aux_loss.detach()) == pytest.approx(float(ref.aux_loss.detach()), abs=1e-12)
    assert ep.comm == {"counts": 1, "counts_bytes_sent": 32, "forward_tokens": 1,
                       "forward_tokens_bytes_sent": ep.comm["forward_tokens_bytes_sent"], "forward_tokens_back": 1,
                       "forward_tokens_back_bytes_sent": ep.comm["forward_tokens_bytes_sent"]}
    kept = sum(ref.stats["kept_per_expert"])
    assert ep.comm["forward_tokens_bytes_sent"] == kept * 8 * 8  # rows of 8 float64


def test_expert_parallel_on_an_empty_batch_takes_part_with_empty_tensors():
    """A rank with no token still makes every exchange, forward and backward, with empty tensors."""
    ref = X.MoEFeedForward(8, 12, 4, 2, capacity_factor=0.75, seed=3).double()
    ep = X.ExpertParallelMoE(ref)
    x = torch.empty(0, 5, 8, dtype=torch.float64, requires_grad=True)
    out = ep(x)
    assert out.shape == x.shape and float(ep.aux_loss.detach()) == 0.0
    (out.sum() + ep.aux_loss).backward()
    assert x.grad.shape == x.shape and float(ep.router.weight.grad.abs().sum()) == 0.0
    assert all(float(p.grad.abs().sum()) == 0.0 for p in ep.experts.parameters())
    assert ep.comm == {"counts": 1, "counts_bytes_sent": 32, "forward_tokens": 1, "forward_tokens_bytes_sent": 0,
                       "forward_tokens_back": 1, "forward_tokens_back_bytes_sent": 0, "backward_tokens_back": 1,
                       "backward_tokens_back_bytes_sent": 0, "backward_tokens": 1, "backward_tokens_bytes_sent": 0}
    assert ep.stats["tokens"] == 0 and ep.stats["tokens_per_expert"] == [0, 0, 0, 0]


def test_uneven_groups_and_replicated_grads_in_one_process():
    assert X.group_sizes(10, [4, 0, 6]) == [4, 0, 6]
    with pytest.raises(ValueError, match="summing to the 10 tokens"):
        X.group_sizes(10, [4, 4])
    ref = X.MoEFeedForward(8, 12, 4, 1, capacity_factor=1.0, seed=3).double()
    x = torch.randn(12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # groups of 12 and 0 tokens: the capacity of one group of 12
        torch.testing.assert_close(ref(x, groups=[12, 0]), ref(x, groups=1), rtol=0, atol=0)
        torch.testing.assert_close(ref(x, groups=[0, 6, 6]), ref(x, groups=2), rtol=0, atol=0)
    ep = X.ExpertParallelMoE(ref)
    ep(x).sum().backward()
    before = ep.router.weight.grad.clone()
    assert X.sum_replicated_grads(ep) == ["router.weight"]  # the experts are not replicated: left alone
    assert torch.equal(ep.router.weight.grad, before)  # no process group: nothing to sum


def test_all_to_all_bytes():
    assert X.all_to_all_bytes([[3, 5], [2, 4]], 16, 4) == (5 + 2) * 16 * 4
    assert X.all_to_all_bytes([[3, 5], [2, 4]], 16, 4, include_self=True) == 14 * 16 * 4


def test_moe_llama_swaps_the_mlps_and_leaves_the_dense_model_alone():
    cfg = TINY_LLAMA.replace(num_layers=2, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2,
                             vocab_size=64, head_dim=None)
    tokens, _ = token_batch(2, 8, 64, seed=0)
    dense = Llama(cfg, seed=0)
    before = dense(tokens)
    again = Llama(cfg, seed=0)
    assert torch.equal(again(tokens), before)  # building an MoE elsewhere changes nothing
    moe = X.moe_llama(Llama(cfg, seed=0), 4, 2, capacity_factor=1.0)
    assert torch.equal(dense(tokens), before)
    assert all(isinstance(block.mlp, X.MoEFeedForward) for block in moe.layers)
    with pytest.raises(ValueError, match="no MoE layer has run a forward yet"):
        X.moe_aux_loss(moe)
    logits = moe(tokens)
    assert logits.shape == before.shape and not torch.allclose(logits, before)
    aux = X.moe_aux_loss(moe)
    assert float(aux.detach()) == pytest.approx(sum(float(b.mlp.aux_loss.detach()) for b in moe.layers))
    n_dense = sum(p.numel() for p in dense.parameters())
    n_moe = sum(p.numel() for p in moe.parameters())
    mlp = 3 * 32 * 48
    assert n_moe - n_dense == 2 * (3 * mlp + 4 * 32)  # per block: 3 more experts and a router


# ----------------------------------------------------------------------------------------------------
# Real processes
# ----------------------------------------------------------------------------------------------------
def _run(nproc: int, args: list[str], tmp_path_factory, timeout_s: float = 560) -> list[dict]:
    return launch_forked(experts_worker.__file__, args, nproc=nproc, timeout_s=timeout_s,
                  records_dir=tmp_path_factory.mktemp(f"ep{nproc}"), env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _run(2, ["--configs", "4:2:none,4:1:1.0,6:2:0.75", "--dtypes", "float32,float64", "--llama"],
                tmp_path_factory)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return _run(3, ["--configs", "6:2:none,6:1:0.8"], tmp_path_factory)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _run(4, ["--ep", "2", "--configs", "6:2:0.75,4:1:none", "--llama"], tmp_path_factory)


# E:k:capacity_factor:sequences of each rank:the rank whose experts no token chooses (see experts_worker)
EMPTY_2 = "4:2:none:3/0:1,4:1:1.0:0/3:1,6:2:0.75:2/2:0"  # rank 1 idle; rank 0 sends nothing; rank 0 gets nothing
EMPTY_3 = "6:2:none:2/3/0:1,6:1:1.0:0/2/2:2,6:2:0.75:0/0/3:-"


@pytest.fixture(scope="module")
def two_empty(tmp_path_factory):  # a rank that dies on an empty tensor fails the launch within seconds
    return _run(2, ["--configs", EMPTY_2, "--dtypes", "float32,float64", "--seq", "6"], tmp_path_factory, 240)


@pytest.fixture(scope="module")
def three_empty(tmp_path_factory):
    return _run(3, ["--configs", EMPTY_3, "--seq", "6"], tmp_path_factory, 240)


def _check(records: list[dict], world: int, ep: int, configs: int) -> None:
    compare = [r for r in records if r["case"] == "compare"]
    assert sorted({r["rank"] for r in compare}) == list(range(world))
    assert len(compare) == world * configs
    for r in compare:
        tol = TOL if r["dtype"] == "float32" else 1e-12
        assert max(r["out"], r["aux"], r["dx"], r["drouter"], r["dexperts"]) <= tol, r
        assert r["same_stats"], (r["stats"], r["ref_stats"])
        assert r["ep"] == ep and len(r["local_experts"]) == r["experts"] // ep
        # the collectives: counts, 2 token exchanges forward, 2 backward, one all-reduce of the statistics
        calls = [(c["phase"], c["dtype"]) for c in r["calls"]]
        assert calls == [("forward", "int64"), ("forward", r["dtype"]), ("forward", r["dtype"]),
                         ("backward", r["dtype"]), ("backward", r["dtype"])], calls
        assert {k: v for k, v in r["comm"].items() if not k.endswith("bytes_sent")} == {
            "counts": 1, "forward_tokens": 1, "forward_tokens_back": 1, "backward_tokens_back": 1,
            "backward_tokens": 1, "all_reduce": 1}
        forward = [c for c in r["calls"] if c["phase"] == "forward"]
        backward = [c for c in r["calls"] if c["phase"] == "backward"]
        assert backward[0]["rows"] == forward[1]["rows"] and backward[1]["rows"] == forward[2]["rows"]
    # every exchange's splits agree across the ranks of a group: what s sends to d is what d receives from s
    for key in {(r["experts"], r["top_k"], r["capacity_factor"], r["dtype"], r["replica"]) for r in compare}:
        group = sorted((r for r in compare if (r["experts"], r["top_k"], r["capacity_factor"], r["dtype"],
                                               r["replica"]) == key), key=lambda r: r["group_rank"])
        assert len(group) == ep
        sent = [r["calls"][1]["rows"] for r in group]  # dispatch: rows from this rank to each rank
        back = [r["calls"][2]["rows"] for r in group]  # combine: rows from this rank back to each rank
        assert all(back[d][s] == sent[s][d] for s in range(ep) for d in range(ep))
        kept = sum(group[0]["stats"]["kept_per_expert"])
        assert sum(map(sum, sent)) == kept  # every kept decision travels once each way
        element = 4 if key[3] == "float32" else 8
        assert sum(r["calls"][1]["bytes_to_others"] for r in group) == X.all_to_all_bytes(sent, group[0]["hidden"],
                                                                                           element)
    assert any(r["stats"]["dropped"] > 0 for r in compare)  # a case with dropped tokens
    assert any(r["capacity_factor"] is None and r["stats"]["dropped"] == 0 for r in compare)


@distributed
def test_expert_parallel_on_2_processes_equals_one_process(two):
    _check(two, 2, 2, 3 * 2)
    assert {r["experts"] for r in two if r["case"] == "compare"} == {4, 6}  # 2 and 3 experts per rank


@distributed
def test_expert_parallel_on_3_processes_equals_one_process(three):
    _check(three, 3, 3, 2)


@distributed
def test_expert_parallel_in_two_groups_of_2_among_4_processes(four):
    _check(four, 4, 2, 2)
    assert {r["replica"] for r in four if r["case"] == "compare"} == {0, 1}


@distributed
def test_moe_llama_expert_parallel_equals_one_process(two, four):
    for records, world in ((two, 2), (four, 4)):
        llama = [r for r in records if r["case"] == "llama"]
        assert len(llama) == world
        for r in llama:  # every replicated weight's gradient summed over the group, the experts' whole on their rank
            assert max(r["logits"], r["aux"], r["dembed"], r["dreplicated"], r["drouters"], r["dexperts"]) <= TOL, r
            assert r["replicated"] > 10


def _empty_cases(records: list[dict], ep: int) -> set[str]:
    """What the empty exchanges of the records were: a rank that sent no token, received none, an idle expert."""
    seen = set()
    compare = [r for r in records if r["case"] == "compare"]
    for key in {(r["experts"], r["top_k"], r["capacity_factor"], r["dtype"]) for r in compare}:
        group = sorted((r for r in compare if (r["experts"], r["top_k"], r["capacity_factor"], r["dtype"]) == key),
                       key=lambda r: r["group_rank"])
        sent = [r["calls"][1]["rows"] for r in group]
        for rank in range(ep):
            if sum(sent[rank]) == 0:
                seen.add("sends nothing")
            if sum(sent[s][rank] for s in range(ep)) == 0:
                seen.add("receives nothing")
            if sum(sent[rank]) == 0 and sum(sent[s][rank] for s in range(ep)) == 0:
                seen.add("idle")
        if 0 in group[0]["stats"]["kept_per_expert"]:
            seen.add("expert without a token")
        if group[0]["starve"] is not None:
            starved = X.experts_of(group[0]["starve"], group[0]["experts"], ep)
            assert all(group[0]["stats"]["tokens_per_expert"][e] == 0 for e in starved), group[0]["stats"]
    return seen


@distributed
def test_expert_parallel_with_empty_tensors_on_2_processes_equals_one_process(two_empty):
    _check(two_empty, 2, 2, 3 * 2)
    assert _empty_cases(two_empty, 2) == {"sends nothing", "receives nothing", "idle", "expert without a token"}


@distributed
def test_expert_parallel_with_empty_tensors_on_3_processes_equals_one_process(three_empty):
    _check(three_empty, 3, 3, 3)
    assert _empty_cases(three_empty, 3) == {"sends nothing", "receives nothing", "expert without a token"}
    assert [r["local_tokens"] for r in three_empty if r["case"] == "compare" and r["rank"] == 2] == [0, 12, 18]
