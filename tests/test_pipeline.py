"""dlo.parallel.pipeline: stage split, schedules and their promises, on 2 and 4 real gloo processes.

One launch per world size runs every schedule (naive, AFAB with non-blocking and blocking transfers,
1F1B, interleaved 1F1B, and torch.distributed.pipelining's GPipe / 1F1B) and records each rank's
gradients and the weights after one SGD step; the single-process reference is computed here from the
same model and batch (imported from the worker).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.runtime import launch
from dlo.models.llama import Llama
from dlo.models.config import TransformerConfig
from dlo.parallel.pipeline import (Pipe, bubble_fraction, bubble_theory, build_stage, check_world_size, interleaved_actions, micro_batch_size, one_f_one_b_actions, split_layers, split_model, train_step)

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed


def _load_worker():
    spec = importlib.util.spec_from_file_location("_dlo_test_pipeline_cases", SCRIPTS / "pipeline_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load_worker()
OURS = ("naive", "afab", "afab_blocking", "1f1b", "interleaved")
TORCH = ("torch_gpipe", "torch_1f1b")


@pytest.fixture(scope="module")
def reference():
    """Loss, gradients and SGD-updated weights of the whole model in one process, on the whole batch."""
    model = W.make_model()
    ids, labels = W.make_batch()
    loss = model.loss(ids, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=W.LR).step()
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"loss": loss.item(), "grads": grads, "after": after, "names": set(grads)}


@pytest.fixture(scope="module", params=[2, 4], ids=["2procs", "4procs"])
def runs(request, tmp_path_factory):
    nproc = request.param
    records = launch(SCRIPTS / "pipeline_cases.py", nproc=nproc, records_dir=tmp_path_factory.mktemp(f"pp{nproc}"),
                     timeout_s=240, use_srun=False, echo=False, env={"OMP_NUM_THREADS": "1"})
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["case"], []).append(r)
    assert all([r["rank"] for r in rs] == list(range(nproc)) for rs in out.values())
    return nproc, out


def _compare(ranks: list[dict], reference: dict, key: str, rtol: float, atol: float) -> None:
    seen: set[str] = set()
    for r in ranks:
        for name, values in r[key].items():
            assert name not in seen, f"{name} appears on two stages"
            seen.add(name)
            want = reference[key][name].reshape(-1)
            torch.testing.assert_close(torch.tensor(values), want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    assert seen == reference["names"], "every parameter lives on exactly one stage"


@distributed
@pytest.mark.parametrize("case", OURS + TORCH)
def test_pipeline_step_equals_single_process(runs, reference, case):
    nproc, by_case = runs
    ranks = by_case[case]
    for r in ranks:  # every rank reports the same loss, the whole batch's mean
        assert r["loss"] == pytest.approx(reference["loss"], rel=1e-6, abs=1e-6)
    _compare(ranks, reference, "grads", rtol=1e-4, atol=1e-6)
    _compare(ranks, reference, "after", rtol=1e-5, atol=1e-6)  # one optimizer step: identical weights


@distributed
def test_in_flight_activations_afab_vs_1f1b(runs):
    nproc, by_case = runs
    m = W.MICRO
    assert [r["max_in_flight"] for r in by_case["afab"]] == [m] * nproc  # every micro-batch alive at once
    one = [r["max_in_flight"] for r in by_case["1f1b"]]
    assert one == [min(nproc - rank, m) for rank in range(nproc)] and max(one) <= nproc
    assert [r["max_in_flight"] for r in by_case["naive"]] == [1] * nproc
    # activations kept for backward: 1F1B's peak is a fraction of AFAB's on every stage
    for a, b in zip(by_case["afab"], by_case["1f1b"]):
        assert b["peak_activation_bytes"] < a["peak_activation_bytes"]
    # the events: every micro-batch ran forward then backward once on every rank, in 1F1B order
    for r in by_case["1f1b"]:
        order = [(e["kind"], e["mb"]) for e in r["events"]]
        assert order == one_f_one_b_actions(r["rank"], nproc, m)
    assert by_case["afab"][0]["gathered"] == nproc and by_case["afab"][1]["gathered"] is None


# ----------------------------------------------------------------------------------------------------
# Single-process pieces: split, schedules as lists, bad configurations
# ----------------------------------------------------------------------------------------------------
def test_split_by_layers_and_by_params():
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]
    # a big embedding and head: the end stages get fewer layers
    parts = split_layers(8, 4, by="params", layer_costs=[10] * 8, first_cost=25, last_cost=25)
    assert [len(r) for r in parts] == [1, 3, 3, 1]
    model = Llama(W.CFG.replace(vocab_size=2048), seed=0)
    stages = split_model(model, 4, by="params")
    assert [len(s.layer_ids) for s in stages][0] < 2 and sum(len(s.layer_ids) for s in stages) == 8
    assert stages[0].embed_tokens is model.embed_tokens and stages[-1].lm_head is model.lm_head  # shared, not copied


def test_stages_chained_equal_the_model():
    model = W.make_model()
    ids, _ = W.make_batch()
    x = ids
    for stage in split_model(model, 3):
        x = stage(x)
    torch.testing.assert_close(x, model(ids), rtol=0, atol=0)


def test_single_process_pipe_accumulates_the_full_gradient():
    model = W.make_model()
    ids, labels = W.make_batch()
    pipe = Pipe(build_stage(model, 0, 1), (ids, labels), 4)
    stats = train_step(pipe, "afab")
    ref = W.make_model()
    loss = ref.loss(ids, labels)
    loss.backward()
    assert stats.loss == pytest.approx(loss.item(), rel=1e-6)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    assert bubble_fraction([stats])["bubble"] < 0.05  # one stage: always busy (apart from bookkeeping)


def test_a_micro_batch_without_backward_is_an_error():
    pipe = Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 2)
    pipe.reset()
    for mb in range(2):
        pipe.forward_compute(mb, pipe.recv_forward(mb))
    pipe.backward_compute(0, None)
    with pytest.raises(RuntimeError, match=r"micro-batch\(es\) \[1\] never ran backward"):
        pipe.finish()


def test_schedule_orders():
    assert one_f_one_b_actions(0, 4, 8)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert one_f_one_b_actions(3, 4, 8)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    for rank in range(4):
        acts = one_f_one_b_actions(rank, 4, 8)
        assert sorted(acts) == sorted([("F", i) for i in range(8)] + [("B", i) for i in range(8)])
        inter = interleaved_actions(rank, 4, 8, 2)
        assert sorted(inter) == sorted([(k, i, c) for k in "FB" for i in range(8) for c in range(2)])
    assert bubble_theory(4, 8) == pytest.approx(3 / 11) and bubble_theory(4, 8, 2) == pytest.approx(3 / 19)


def test_bad_configurations_say_what_to_do():
    with pytest.raises(ValueError, match="batch 6 cannot be cut into 4 equal micro-batches: choose micro_batches among"):
        micro_batch_size(6, 4)
    with pytest.raises(ValueError, match="5 stages for 4 layers: every stage needs at least one layer"):
        split_layers(4, 5)
    with pytest.raises(ValueError, match=r"world size 3 != 2 pipeline stages: launch one process per stage"):
        check_world_size(3, 2)
    with pytest.raises(ValueError, match=r"world size 6 is not 4 stages x 2 data-parallel replicas = 8"):
        check_world_size(6, 4, data_parallel=2)
    check_world_size(8, 4, data_parallel=2)
    stage = build_stage(W.make_model(), 0, 4)  # a stage of a 4-stage split, in a world of 2
    with pytest.raises(ValueError, match="world size != number of stages"):
        Pipe(stage, W.make_batch(), 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="cannot be cut into 3 equal micro-batches"):
        Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 3)
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        split_model(Llama(W.CFG.replace(tie_embeddings=True)), 2)
    with pytest.raises(ValueError, match="micro_batches=1"):
        train_step(Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 2), "naive")
    with pytest.raises(ValueError, match="multiple of 4"):
        interleaved_actions(0, 4, 6, 2)


def test_checkers_report_a_wrong_schedule():
    from dlo.course import checks
    from dlo.parallel.pipeline import afab_step

    with pytest.raises(checks.CheckFailed, match=r"action 2 should be \('B', 0\), got \('F', 2\)"):
        checks.check("pipeline", "1f1b", one_f_one_b_step=afab_step)  # AFAB is not 1F1B

    def forgets_backward(pipe):
        pipe.send_forward(0, pipe.forward_compute(0, pipe.recv_forward(0)))

    with pytest.raises(checks.CheckFailed, match="every micro-batch needs a forward and a backward"):
        checks.check("pipeline", "naive", naive_step=forgets_backward)
