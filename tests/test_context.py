"""dlo.parallel.context: sharding round-trips, balanced causal work, the merge rule, ring attention equal to SDPA.

One process: the sharding, the work counts, the merge against a softmax over the concatenated keys, the ring
simulated for every rank in one process, its backward against SDPA's. Then two launches (2 and 3 gloo processes,
:mod:`dlo.parallel.context_worker`) run the real ring, forward and backward, causal and not, both layouts,
with several heads and grouped K/V heads, and record what each rank posted together; those batches are replayed
under NCCL's matching rules (:mod:`dlo.parallel.p2p_replay`).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dlo  # noqa: F401
from dlo.parallel import context as C
from dlo.parallel import context_worker
from dlo.parallel.p2p_replay import P2POp, replay
from dlo.runtime.launch import launch_forked

distributed = pytest.mark.distributed
TOL = 1e-5  # fp32


# ----------------------------------------------------------------------------------------------------
# Sharding
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("layout", C.LAYOUTS)
def test_shard_then_unshard_is_the_identity(cp, layout):
    g = torch.Generator().manual_seed(cp)
    for seq in (2 * cp, 4 * cp, 12 * cp, 2 * cp * 7):
        x = torch.randn(2, 3, seq, 5, generator=g)
        parts = [C.shard(x, cp, r, layout) for r in range(cp)]
        assert all(p.shape == (2, 3, seq // cp, 5) for p in parts)
        assert torch.equal(C.unshard(parts, layout), x)
        # every position is held by exactly one rank
        held = torch.cat([C.shard_positions(seq, cp, r, layout) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(seq))
        y = torch.randn(seq, 4, generator=g)  # another sequence dimension
        assert torch.equal(C.unshard([C.shard(y, cp, r, layout, dim=0) for r in range(cp)], layout, dim=0), y)


def test_balanced_layout_gives_each_rank_an_early_and_a_late_chunk():
    assert C.rank_chunks(0, 4) == [0, 7] and C.rank_chunks(3, 4) == [3, 4]
    assert C.shard_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert C.shard_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert C.shard_positions(8, 2, 1, "contiguous").tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="must be a multiple of 6"):
        C.shard(torch.zeros(1, 1, 8, 2), 3, 0)
    with pytest.raises(ValueError, match="rank 3 is not in a context-parallel group of 3"):
        C.rank_chunks(3, 3)
    with pytest.raises(ValueError, match="unknown layout"):
        C.shard_positions(8, 2, 0, "zigzag")


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_balanced_work_is_equal_contiguous_is_not(cp):
    for seq in (2 * cp, 16 * cp, 2 * cp * 33):
        balanced, contiguous = C.causal_work(seq, cp), C.causal_work(seq, cp, "contiguous")
        total = seq * (seq + 1) // 2
        assert sum(balanced) == sum(contiguous) == total
        assert len(set(balanced)) == 1
        assert contiguous == sorted(contiguous) and contiguous[-1] > contiguous[0]
        # the last rank of the contiguous split does about (2·cp - 1) times the first's work
        c = seq // cp
        assert contiguous[0] == c * (c + 1) // 2 and contiguous[-1] == contiguous[0] + (cp - 1) * c * c


# ----------------------------------------------------------------------------------------------------
# The merge
# ----------------------------------------------------------------------------------------------------
def _attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_merge_equals_softmax_over_the_concatenated_keys(dtype, tol):
    g = torch.Generator().manual_seed(0)
    for trial in range(6):
        la, lb, d = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g)), 8
        q = torch.randn(2, 3, 5, d, generator=g, dtype=torch.float64) * (1 + trial)
        k = torch.randn(2, 3, la + lb, d, generator=g, dtype=torch.float64)
        v = torch.randn(2, 3, la + lb, d, generator=g, dtype=torch.float64)
        want, want_lse = _attention(q, k, v)
        a = [t.to(dtype) for t in _attention(q, k[..., :la, :], v[..., :la, :])]
        b = [t.to(dtype) for t in _attention(q, k[..., la:, :], v[..., la:, :])]
        out, lse = C.merge_partial(a[0], a[1], b[0], b[1])
        assert out.dtype == lse.dtype == dtype
        torch.testing.assert_close(out, want.to(dtype), rtol=tol, atol=tol)
        torch.testing.assert_close(lse, want_lse.to(dtype), rtol=tol, atol=tol)
        out2, lse2 = C.merge_partial(b[0], b[1], a[0], a[1])  # the order does not matter
        torch.testing.assert_close(out2, out, rtol=tol, atol=tol)


def test_merge_does_not_overflow_and_ignores_an_empty_part():
    out_a, out_b = torch.randn(4, 3), torch.randn(4, 3)
    lse_a, lse_b = torch.tensor([500.0, -300.0, 90.0, 0.0]), torch.tensor([499.0, -301.0, float("-inf"), 1.0])
    out, lse = C.merge_partial(out_a, lse_a, out_b, lse_b)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    wa = 1 / (1 + math.exp(-1.0))
    torch.testing.assert_close(out[0], wa * out_a[0] + (1 - wa) * out_b[0])
    torch.testing.assert_close(out[2], out_a[2])  # every key of b masked: a alone
    assert lse[2] == 90.0
    ninf = torch.full((2,), float("-inf"))
    out, lse = C.merge_partial(torch.zeros(2, 3), ninf, torch.zeros(2, 3), ninf)
    assert torch.equal(out, torch.zeros(2, 3)) and torch.equal(lse, ninf)  # both empty: zeros, not NaN


def test_block_kinds():
    assert [C.block_kind(2, j) for j in range(4)] == ["full", "full", "diagonal", "skip"]
    assert C.block_kind(0, 3, causal=False) == "full"


# ----------------------------------------------------------------------------------------------------
# The ring in one process
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_simulated_ring_equals_sdpa(cp):
    g = torch.Generator().manual_seed(cp)
    for layout in C.LAYOUTS:
        for causal in (True, False):
            for heads, kv_heads in ((4, 4), (4, 2), (6, 1)):
                seq = 2 * cp * 3
                q = torch.randn(2, heads, seq, 8, generator=g)
                k, v = torch.randn(2, 2, kv_heads, seq, 8, generator=g).unbind(0)
                ref = F.scaled_dot_product_attention(q, C.repeat_kv(k, heads), C.repeat_kv(v, heads), is_causal=causal)
                stats: list[dict] = []
                got = C.simulate_ring(q, k, v, cp, causal=causal, layout=layout, stats=stats)
                torch.testing.assert_close(got, ref, rtol=0, atol=TOL)
                pairs = [s["pairs"] for s in stats]
                assert pairs == (C.causal_work(seq, cp, layout) if causal else [seq * seq // cp] * cp)
                if causal and layout == "contiguous":
                    assert [s.get("skip", 0) for s in stats] == list(range(cp - 1, -1, -1))


def test_balanced_ring_never_skips_a_whole_step():
    """With the balanced layout every rank has the same blocks at every step: cp diagonal blocks in all,
    and each step after the first half-visible (2 of its 4 chunk pairs)."""
    stats: list[dict] = []
    C.simulate_ring(*torch.randn(3, 1, 2, 48, 4), 3, stats=stats)
    assert all(s == {"diagonal": 2, "full": 1 + 2 * 2, "skip": 1 + 2 * 2, "pairs": stats[0]["pairs"]} for s in stats)


@pytest.mark.parametrize("causal", [True, False])
def test_one_process_ring_and_its_backward_equal_sdpa(causal):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 12, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 4, 12, 8, generator=g, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, C.repeat_kv(k, 4), C.repeat_kv(v, 4), is_causal=causal)
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    out, lse = C.ring_attention(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    got = torch.autograd.grad((out * w).sum(), (q, k, v), retain_graph=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # the lse is differentiable too (a later merge uses it)
    mask = torch.ones(12, 12, dtype=torch.bool).tril() if causal else None
    ref_out, ref_lse = _attention(q, C.repeat_kv(k, 4), C.repeat_kv(v, 4), mask)
    want = torch.autograd.grad((ref_out * w).sum() + (ref_lse ** 2).sum(), (q, k, v))
    got = torch.autograd.grad((out * w).sum() + (lse ** 2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_ring_attention_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        C.ring_attention(torch.zeros(1, 3, 4, 2), torch.zeros(1, 2, 4, 2), torch.zeros(1, 2, 4, 2))
    with pytest.raises(ValueError, match=r"\[batch, heads, seq, head_dim\]"):
        C.ring_attention(torch.zeros(3, 4, 2), torch.zeros(3, 4, 2), torch.zeros(3, 4, 2))
    with pytest.raises(ValueError, match="must be a multiple of 2"):  # the balanced layout: 2 chunks per rank
        C.ring_attention(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))


def test_kv_bytes_per_rank_shrink_with_cp():
    one = C.kv_bytes_per_rank(8192, 1)
    eight = C.kv_bytes_per_rank(8192, 8)
    assert eight["q"] * 8 == one["q"] and eight["kv"] * 8 == one["kv"]
    assert eight["scores"] * 64 == one["scores"]  # a block of (S/cp)² instead of S²
    assert eight["kv_in_flight"] == eight["kv"] and one["kv_in_flight"] == 0


# ----------------------------------------------------------------------------------------------------
# P2P order under NCCL's rules
# ----------------------------------------------------------------------------------------------------
def _replay(ops_per_rank):
    return replay([[P2POp(*op) for op in ops] for ops in ops_per_rank])


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_ring_order_replays_under_nccl_rules(cp):
    assert _replay(C.ring_p2p_ops(cp)).ok
    assert _replay(C.ring_p2p_ops(cp, backward=True)).ok
    r = _replay(C.ring_p2p_ops(cp, one_at_a_time=True))  # each send alone first: every rank waits on its send
    assert r.deadlock and set(r.blocked) == set(range(cp))
    assert all(str(ops[0]).startswith("send to rank") for ops in r.blocked.values())


def test_ring_ops_name_the_travelling_block():
    ops = C.ring_p2p_ops(3)
    assert [str(P2POp(*o)) for o in ops[1]] == ["send to rank 2 (K/V of rank 1)", "recv from rank 0 (K/V of rank 0)",
                                                "send to rank 2 (K/V of rank 0)", "recv from rank 0 (K/V of rank 2)"]
    assert [o.batch for o in ops[1]] == [0, 0, 1, 1]


def test_context_module_does_not_load_the_pipeline_or_models():
    """Every ring process imports it: it must stay light (no torchvision, no pipeline, no model code)."""
    import subprocess
    import sys
    code = ("import sys, dlo.parallel.context, dlo.parallel.context_worker; "
            "print(sorted(m for m in sys.modules if m.startswith(('dlo.parallel.pipeline', 'dlo.models', 'torchvision'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ring_schedule():
    assert C.ring_schedule(3) == [[("send", 1), ("recv", -1)], [("send", 1), ("recv", -1)], []]
    assert C.ring_schedule(1) == [[]]


# ----------------------------------------------------------------------------------------------------
# Real processes
# ----------------------------------------------------------------------------------------------------
def _run(nproc: int, tmp_path_factory) -> list[dict]:
    return launch_forked(context_worker.__file__, ["--seq", "24" if nproc == 2 else "36", "--torch-cp"], nproc=nproc,
                  timeout_s=500, records_dir=tmp_path_factory.mktemp(f"cp{nproc}"),
                  env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _run(2, tmp_path_factory)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return _run(3, tmp_path_factory)


def _check_world(records: list[dict], cp: int) -> None:
    compare = [r for r in records if r["case"] == "compare"]
    assert sorted({r["rank"] for r in compare}) == list(range(cp))
    configs = {(r["layout"], r["causal"], r["heads"], r["kv_heads"]) for r in compare}
    assert len(configs) == 2 * 2 * 3 and len(compare) == cp * len(configs)
    assert {(h, kv) for _, _, h, kv in configs} == {(4, 4), (4, 2), (6, 1)}  # grouped K/V heads included
    for r in compare:
        assert max(r["out"], r["dq"], r["dk"], r["dv"]) <= TOL, r
        assert r["local_seq"] == r["seq"] // cp
        assert r["stats"]["batches"] == cp - 1  # one batch per ring step but the last
        work = C.causal_work(r["seq"], cp, r["layout"])[r["rank"]] if r["causal"] else r["seq"] ** 2 // cp
        assert r["stats"]["pairs"] == work


def _replay_posted(records: list[dict], cp: int, phase: str):
    """Every configuration's batches, as the ranks really posted them, replayed under NCCL's rules."""
    results = []
    by_config: dict = {}
    for r in records:
        if r["case"] == "compare":
            by_config.setdefault((r["layout"], r["causal"], r["heads"]), {})[r["rank"]] = r["posted"][phase]
    for per_rank in by_config.values():
        ops = [[P2POp("send" if kind == "isend" else "recv", peer, b) for b, batch in enumerate(per_rank[rank])
                for kind, peer in batch] for rank in range(cp)]
        results.append(replay(ops))
    return results


@distributed
def test_ring_attention_on_2_processes_equals_sdpa(two):
    _check_world(two, 2)


@distributed
def test_ring_attention_on_3_processes_equals_sdpa(three):
    _check_world(three, 3)


@distributed
def test_posted_batches_replay_under_nccl_rules(two, three):
    for records, cp in ((two, 2), (three, 3)):
        for phase, batches in (("forward", cp - 1), ("backward", cp)):
            for result in _replay_posted(records, cp, phase):
                assert result.ok, result.explain()
                assert result.batches == [batches] * cp
        for r in records:  # each batch: one send to the next rank and one receive from the previous
            if r["case"] == "compare":
                for batch in r["posted"]["forward"] + r["posted"]["backward"]:
                    assert batch == [["isend", (r["rank"] + 1) % cp], ["irecv", (r["rank"] - 1) % cp]]


@distributed
def test_torch_context_parallel_on_gloo_cpu(two):
    """PyTorch's own context_parallel exists in this torch but has no CPU attention kernel with a sharding
    rule: it does not run on gloo/CPU, which the notebook says. If a later torch runs it, this test says so."""
    rec = next(r for r in two if r["case"] == "torch_cp")
    if rec["runs"]:
        pytest.fail("torch's context_parallel now runs on CPU: compare it with ring_attention in the notebook")
    assert rec["error"]  # why it did not run (or was not found), for the notebook
