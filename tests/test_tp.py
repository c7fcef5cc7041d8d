"""dlo.parallel.comm / dlo.parallel.tensor: from-scratch tensor parallelism equals the single-process Llama.

Two launches (process start-up costs seconds on 2 cores): 2 gloo processes run tp=2, DTensor tp=2 and the
divisibility errors; 4 processes run tp=4, tp 2 × dp 2 and DTensor tp=4. Each rank compares itself with
the single-process :class:`dlo.models.llama.Llama` (same seed, same batch) and records the largest differences.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.runtime.launch import launch_forked
from dlo.models.llama import Llama, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel import comm
from dlo.parallel.tensor import TPLlama, comm_theory, dp_group_ranks, tp_dp_groups, tp_group_ranks

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed
TOL = 1e-5  # fp32


def _by_case(records):
    out = {}
    for r in records:
        out.setdefault(r["case"], []).append(r)
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _by_case(launch_forked(SCRIPTS / "tp_cases.py", ["2x1", "dtensor", "dtensor_tied", "errors"], nproc=2,
                           timeout_s=200, records_dir=tmp_path_factory.mktemp("tp2")))


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _by_case(launch_forked(SCRIPTS / "tp_cases.py", ["4x1", "2x2", "dtensor"], nproc=4, timeout_s=300,
                           records_dir=tmp_path_factory.mktemp("tp4")))


def _assert_equal_to_reference(ranks, world):
    assert sorted(r["rank"] for r in ranks) == list(range(world))
    for r in ranks:
        assert r["logits"] <= TOL and r["loss"] <= TOL, r
        assert len(r["grads"]) == 3 + 9 * 2 and max(r["grads"].values()) <= TOL, r["grads"]  # every parameter
        if "weights" in r:
            assert max(r["weights"].values()) <= TOL  # one SGD step: equal weights
            assert r["loss_gathered"] <= TOL  # gathered logits + F.cross_entropy: the same loss


@distributed
def test_tp2_equals_single_process(two):
    _assert_equal_to_reference(two["2x1"], 2)
    assert two["2x1"][0]["local_vocab"] == 128  # the LM head is split: no rank holds the full logits


@distributed
def test_tp4_equals_single_process(four):
    _assert_equal_to_reference(four["4x1"], 4)
    assert four["4x1"][0]["local_vocab"] == 64


@distributed
def test_tp2_dp2_equals_single_process_on_the_global_batch(four):
    ranks = four["2x2"]
    _assert_equal_to_reference(ranks, 4)
    assert sorted((r["tp_rank"], r["dp_rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@distributed
@pytest.mark.parametrize("case", ["two:2x1", "four:4x1", "four:2x2"])
def test_communication_counts_equal_theory(case, two, four):
    runs = {"two": two, "four": four}[case.split(":")[0]][case.split(":")[1]]
    for r in runs:
        got = {(c["op"], c["phase"]): c["calls"] for c in r["counts"]}
        assert got == {(t["op"], t["phase"]): t["calls"] for t in r["theory"]}
        assert got[("all_reduce", "forward")] == 2 * 2 + 1 + 1 and got[("all_reduce", "backward")] == 2 * 2 + 1
        # bytes: every all-reduce of activations moves [batch, seq, hidden] fp32
        tokens = 4 // r["dp"] * 16
        fwd = next(c for c in r["counts"] if c["op"] == "all_reduce" and c["phase"] == "forward")
        assert fwd["bytes"] == 5 * tokens * 64 * 4 + 2 * tokens * 4


@distributed
def test_dtensor_version_has_equal_numerics(two, four):
    _assert_equal_to_reference(two["dtensor"], 2)
    _assert_equal_to_reference(four["dtensor"], 4)


@distributed
def test_dtensor_keeps_tied_embeddings_tied(two):
    """Llama 3.2 ties the LM head to the embedding: after parallelize_module they must still be one
    parameter, whose gradient (both uses summed) equals one process's."""
    ranks = two["dtensor_tied"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["tied"] and r["extra_params"] == [], r  # lm_head.weight is embed_tokens.weight
        assert r["logits"] <= TOL and r["loss"] <= TOL, r
        assert len(r["grads"]) == 2 + 9 * 2 and max(r["grads"].values()) <= TOL, r["grads"]
        assert r["grads"]["embed_tokens.weight"] <= TOL


@distributed
def test_clear_errors_when_tp_does_not_divide(two):
    msgs = two["errors"][0]["messages"]
    assert msgs["heads"].startswith("TPLlama: tp=2 does not divide num_heads=3")
    assert msgs["kv_heads"].startswith("TPLlama: tp=2 does not divide num_kv_heads=1")
    assert msgs["vocab"].startswith("TPLlama: tp=2 does not divide vocab_size=255")
    assert msgs["intermediate"].startswith("TPLlama: tp=2 does not divide intermediate_size=129")
    assert msgs["tp_dp"].startswith("tp × dp must equal the world size: 2 × 2 = 4 ≠ 2")


# ----------------------------------------------------------------------------------------------------
# One process, no process group
# ----------------------------------------------------------------------------------------------------
def test_group_layouts():
    assert tp_group_ranks(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dp_group_ranks(8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dp_group_ranks(4, 4) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="tp × dp must equal the world size: 2 × 3 = 6 ≠ 4"):
        dp_group_ranks(4, 2, 3)
    with pytest.raises(ValueError, match="tp=3 must divide the world size 4"):
        tp_group_ranks(4, 3)
    g = tp_dp_groups(1)  # no process group: one rank, no groups
    assert (g["tp"], g["dp"], g["tp_rank"], g["dp_rank"], g["tp_group"]) == (1, 1, 0, 0, None)


def test_one_process_tp_model_is_the_model_and_counts_nothing():
    cfg = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                            num_kv_heads=2, tie_embeddings=True)
    ref, tp = Llama(cfg, seed=0), TPLlama(Llama(cfg, seed=0))
    assert [n for n, _ in tp.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ids, labels = token_batch(2, 8, 64, seed=0)
    comm.COUNTER.reset()
    torch.testing.assert_close(tp(ids), ref(ids), rtol=0, atol=0)
    torch.testing.assert_close(tp.loss(ids, labels), ref.loss(ids, labels), rtol=1e-6, atol=1e-6)
    assert comm.COUNTER.rows() == []  # nothing to communicate with one process
    x = torch.randn(3, 4, requires_grad=True)
    for fn in (comm.copy_to_region, comm.reduce_from_region, comm.gather_from_region, comm.scatter_to_region):
        y = fn(x)
        assert torch.equal(y, x)
        (g,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(g, torch.ones_like(x))


def test_comm_theory():
    assert comm_theory(3) == {("all_reduce", "forward"): 8, ("all_reduce", "backward"): 7,
                              ("all_reduce_max", "forward"): 1}
    assert comm_theory(3, vocab_parallel_loss=False)[("all_gather", "forward")] == 1


def test_tp_checker_names_wrong_losses_from_their_models():
    """The tp/8 checker names a wrong vocab-parallel loss by recomputing the loss with each classic mistake:
    without a mistake its model is F.cross_entropy, and each mistake changes the value (so none is named
    for a right answer, and a wrong one is named for what it did)."""
    from dlo.course.tp_cases import models as tp_worker

    logits = torch.randn(2, 6, 10, generator=torch.Generator().manual_seed(7))
    labels = torch.tensor([[0, 9, 4, 5, -100, 5], [3, 7, 1, 8, 2, 6]])
    ref = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 10), labels.reshape(-1), ignore_index=-100))
    for tp in (2, 5):  # the slices of a vocabulary of 10
        assert abs(tp_worker._ce_variant(logits, labels, tp) - ref) < 1e-6
        assert tp_worker._ce_hint(torch.tensor(ref), logits, labels, tp) == ""
    values = [tp_worker._ce_variant(logits, labels, 2, **kwargs) for kwargs, _ in tp_worker._CE_MISTAKES]
    assert all(abs(v - ref) > 1e-3 for v in values)
    assert len({round(v, 4) for v in values}) == len(values)  # each mistake tells itself apart
    for value, (_, words) in zip(values, tp_worker._CE_MISTAKES):
        assert tp_worker._ce_hint(torch.tensor(value), logits, labels, 2) == f" -- {words}"
