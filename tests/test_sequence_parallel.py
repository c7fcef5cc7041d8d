"""Sequence parallelism (``sequence_parallel=True`` in dlo.parallel.tensor) equals one process, moves the same
bytes as plain TP, and divides the norms' activations by tp.

Two launches of gloo processes (tp = 2 and tp = 3: every split of the test model divides by both) run
tests/scripts/sp_cases.py; each rank compares itself with the single-process Llama (same seed, same batch).

Byte convention of the counter (dlo.parallel.comm): an all-reduce and an all-gather count the bytes of their
result, a reduce-scatter the bytes of its input; both are the full ``[batch, seq, hidden]`` tensor. A ring
all-reduce is a reduce-scatter followed by an all-gather, so one all-reduce of N bytes costs what SP's
reduce-scatter + all-gather of N bytes cost: SP's reduce-scatter bytes plus all-gather bytes must equal
**twice** TP's activation all-reduce bytes, in each phase.
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
from dlo.parallel.tensor import (TPLlama, comm_theory, gather_from_sequence_region, norm_saved_bytes_theory,
                                 reduce_scatter_to_sequence_region, saved_bytes_inside)

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed
TOL = 1e-5  # fp32
LAYERS, BATCH, SEQ, HIDDEN = 2, 2, 12, 48  # as in tests/scripts/sp_cases.py


def _run(nproc, cases, tmp_path_factory):
    records = launch_forked(SCRIPTS / "sp_cases.py", cases, nproc=nproc, timeout_s=300,
                            records_dir=tmp_path_factory.mktemp(f"sp{nproc}"))
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r["case"], []).append(r)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {2: _run(2, ["equal", "errors", "dtensor"], tmp_path_factory),
            3: _run(3, ["equal", "dtensor"], tmp_path_factory)}


def _rows(counts):
    return {(c["op"], c["phase"]): c for c in counts}


@distributed
@pytest.mark.parametrize("tp", [2, 3])
def test_sequence_parallel_equals_one_process(runs, tp):
    ranks = runs[tp]["equal"]
    assert sorted(r["rank"] for r in ranks) == list(range(tp))
    for r in ranks:
        assert r["logits"] <= TOL and r["loss"] <= TOL and r["loss_gathered"] <= TOL, r
        assert len(r["grads"]) == 3 + 9 * LAYERS and max(r["grads"].values()) <= TOL, r["grads"]  # every parameter
        assert max(r["weights"].values()) <= TOL, r["weights"]  # one SGD step: equal weights
        # the norms saw this rank's tokens only: without reduce_sequence_parallel_grads their gradient is wrong
        assert r["norm_weight_grads_partial"] > 1e-4


@distributed
@pytest.mark.parametrize("tp", [2, 3])
def test_collectives_are_reduce_scatters_and_all_gathers_with_the_bytes_of_tp(runs, tp):
    for r in runs[tp]["equal"]:
        tp_rows, sp_rows = _rows(r["tp_counts"]), _rows(r["sp_counts"])
        for rows, theory in ((sp_rows, r["theory_sp"]), (tp_rows, r["theory_tp"])):
            assert {k: v["calls"] for k, v in rows.items()} == {(t["op"], t["phase"]): t["calls"] for t in theory}
        per_layer = 2  # attention and MLP; +1: the embedding's (g) and the LM head's (f)
        for phase in ("forward", "backward"):
            assert sp_rows[("reduce_scatter", phase)]["calls"] == per_layer * LAYERS + 1
            assert sp_rows[("all_gather", phase)]["calls"] == per_layer * LAYERS + 1
        # no activation all-reduce: only the loss's two small ones (max, and the two sums per token) are left
        assert sp_rows[("all_reduce", "forward")]["calls"] == 1 and ("all_reduce", "backward") not in sp_rows
        assert sp_rows[("all_reduce", "forward")]["bytes"] == tp_rows[("all_reduce", "forward")]["bytes"] - (
            2 * LAYERS + 1) * BATCH * SEQ * HIDDEN * 4
        activation = BATCH * SEQ * HIDDEN * 4  # one [batch, seq, hidden] fp32 tensor
        tp_activation_bytes = {"forward": tp_rows[("all_reduce", "forward")]["bytes"] - 2 * BATCH * SEQ * 4,
                               "backward": tp_rows[("all_reduce", "backward")]["bytes"]}
        for phase in ("forward", "backward"):
            assert tp_activation_bytes[phase] == (2 * LAYERS + 1) * activation
            sp_bytes = sp_rows[("reduce_scatter", phase)]["bytes"] + sp_rows[("all_gather", phase)]["bytes"]
            assert sp_bytes == 2 * tp_activation_bytes[phase]  # the convention of the module docstring
        # the norms' gradients: one small all-reduce after the backward, hidden floats per norm
        assert r["sp_grads_counts"] == [{"op": "all_reduce", "phase": "sp_grads", "calls": 1,
                                         "bytes": (2 * LAYERS + 1) * HIDDEN * 4}]
        assert r["tp_sp_grads"] == []


@distributed
@pytest.mark.parametrize("tp", [2, 3])
def test_norm_activations_per_rank_are_one_tp_th(runs, tp):
    for r in runs[tp]["equal"]:
        assert r["sp_norm_bytes"] * tp == r["tp_norm_bytes"], (r["sp_norm_bytes"], r["tp_norm_bytes"])
        assert r["tp_norm_bytes"] == r["norm_bytes_theory"]["tp"]
        assert r["sp_norm_bytes"] == r["norm_bytes_theory"]["sp"]


@distributed
@pytest.mark.parametrize("tp", [2, 3])
def test_dtensor_sequence_parallel_plan_has_equal_numerics(runs, tp):
    ranks = runs[tp]["dtensor"]
    assert sorted(r["rank"] for r in ranks) == list(range(tp))
    for r in ranks:
        assert r["logits"] <= TOL and r["loss"] <= TOL and r["loss_vs_scratch"] <= TOL, r
        assert len(r["grads"]) == 3 + 9 * LAYERS and max(r["grads"].values()) <= TOL, r["grads"]


@distributed
def test_clear_error_when_tp_does_not_divide_the_sequence(runs):
    for r in runs[2]["errors"]:
        assert r["message"] == ("sequence parallelism: tp=2 does not divide seq_len=13; use a sequence length that "
                                "is a multiple of 2, or sequence_parallel=False")


# ----------------------------------------------------------------------------------------------------
# One process, no process group
# ----------------------------------------------------------------------------------------------------
def test_one_process_sequence_parallel_model_is_the_model():
    cfg = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                            num_kv_heads=2)
    ref, sp = Llama(cfg, seed=0), TPLlama(Llama(cfg, seed=0), sequence_parallel=True)
    ids, labels = token_batch(2, 7, 64, seed=0)  # any length: tp = 1 divides it
    comm.COUNTER.reset()
    torch.testing.assert_close(sp(ids), ref(ids), rtol=0, atol=0)
    torch.testing.assert_close(sp.loss(ids, labels), ref.loss(ids, labels), rtol=1e-6, atol=1e-6)
    assert comm.COUNTER.rows() == []
    x = torch.randn(2, 6, 3, requires_grad=True)
    for fn in (gather_from_sequence_region, reduce_scatter_to_sequence_region):
        y = fn(x)
        assert torch.equal(y, x)
        (g,) = torch.autograd.grad((y * 2).sum(), x)
        assert torch.equal(g, torch.full_like(x, 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_saved_bytes_formula(dtype):
    cfg = TransformerConfig(vocab_size=64, hidden_size=40, intermediate_size=64, num_layers=3, num_heads=4,
                            num_kv_heads=2)
    model = TPLlama(Llama(cfg, seed=0).to(dtype))
    ids, labels = token_batch(3, 10, 64, seed=2)
    got = saved_bytes_inside([m for n, m in model.named_modules() if n.endswith("norm")],
                             lambda: model.loss(ids, labels))
    got["out"].backward()  # the graph is intact
    want = norm_saved_bytes_theory(3, 3, 10, 40, element_size=torch.finfo(dtype).bits // 8)
    assert got["bytes"] == want
    assert want == 7 * 3 * 10 * (40 * (4 + torch.finfo(dtype).bits // 8) + 4)
    assert norm_saved_bytes_theory(3, 3, 12, 40, 4, sequence_parallel=True) * 4 == norm_saved_bytes_theory(3, 3, 12, 40)


def test_comm_theory_of_sequence_parallelism():
    assert comm_theory(3, sequence_parallel=True) == {
        ("reduce_scatter", "forward"): 7, ("reduce_scatter", "backward"): 7, ("all_gather", "forward"): 7,
        ("all_gather", "backward"): 7, ("all_reduce", "forward"): 1, ("all_reduce_max", "forward"): 1}
    assert comm_theory(3, sequence_parallel=True, vocab_parallel_loss=False)[("all_gather", "forward")] == 8
    assert comm_theory(3) == {("all_reduce", "forward"): 8, ("all_reduce", "backward"): 7,
                              ("all_reduce_max", "forward"): 1}  # unchanged


def test_sentences_are_written_from_the_numbers():
    from dlo.parallel.tensor import sp_comm_sentence, sp_memory_sentence

    assert sp_memory_sentence(2, 4096, 2048, 2048).endswith("exactly 1/2, the formula's number to the byte.")
    assert "1.60x less, not the 2x" in sp_memory_sentence(2, 4096, 2560)
    assert sp_memory_sentence(2, 4096, 4096).endswith("no saving.")
    tp_rows = [{"op": "all_reduce", "phase": "forward", "calls": 6, "bytes": 5 * 1024 + 64},
               {"op": "all_reduce", "phase": "backward", "calls": 5, "bytes": 5 * 1024},
               {"op": "all_reduce", "phase": "sp_grads", "calls": 1, "bytes": 999}]
    sp_rows = [{"op": "all_reduce", "phase": "forward", "calls": 1, "bytes": 64},
               {"op": "reduce_scatter", "phase": "forward", "calls": 5, "bytes": 5 * 1024},
               {"op": "reduce_scatter", "phase": "backward", "calls": 5, "bytes": 5 * 1024},
               {"op": "all_gather", "phase": "forward", "calls": 5, "bytes": 5 * 1024},
               {"op": "all_gather", "phase": "backward", "calls": 5, "bytes": 5 * 1024}]
    said = sp_comm_sentence(2, tp_rows, sp_rows)
    assert "plain TP ran 10 all-reduces of activations" in said and "10 reduce-scatters and 10 all-gathers" in said
    assert "exactly twice, that is the same traffic" in said
    sp_rows[1]["bytes"] *= 2
    assert "2.50x the all-reduced bytes, not the 2x" in sp_comm_sentence(2, tp_rows, sp_rows)


def test_comm_sentence_of_a_clean_replacement_says_same_traffic_and_nothing_remained():
    """SP replaces every activation all-reduce of plain TP by a reduce-scatter and an all-gather of the same bytes;
    the loss's all-reduce is in both and cancels out: the sentence says "the same traffic" and no more."""
    from dlo.parallel.tensor import sp_comm_sentence

    tp_rows = [{"op": "all_reduce", "phase": "forward", "calls": 3, "bytes": 1024 + 64},
               {"op": "all_reduce", "phase": "backward", "calls": 2, "bytes": 1024}]
    sp_rows = [{"op": "all_reduce", "phase": "forward", "calls": 1, "bytes": 64},
               {"op": "reduce_scatter", "phase": "forward", "calls": 2, "bytes": 2048},
               {"op": "all_gather", "phase": "backward", "calls": 2, "bytes": 2048}]
    said = sp_comm_sentence(2, tp_rows, sp_rows)
    assert "plain TP ran 4 all-reduces of activations (0.00 MiB)" in said
    assert said.endswith("exactly twice, that is the same traffic, since a ring all-reduce is a reduce-scatter "
                         "followed by an all-gather.")
    sp_rows[1]["bytes"] = 4096
    assert sp_comm_sentence(2, tp_rows, sp_rows).endswith("3.00x the all-reduced bytes, not the 2x of the same traffic.")
