"""dlo.parallel.ddp and DDP's promises, checked on real gloo processes (CPU) launched with dlo.runtime.launch.

Two launches (process start-up costs seconds on 2 cores), each running several cases; the tests below
read their records. The single-process references are computed here, with the very models and
batches the workers used (imported from the worker script).
"""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

import dlo  # noqa: F401  (must come before any torchvision import)
from dlo.models import ConditionalHeadsNet, StochasticDepthNet, stochastic_depth
from dlo.parallel.ddp import attach_comm_recorder, ddp_wrap, reduce_mean, reduce_sum
from dlo.runtime.validate import check_batch_divisible, per_rank_batch
from dlo.runtime.errors import first_line
from dlo.runtime.launch import launch_forked

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed  # spawns processes: deselect with -m "not distributed"


def _load_worker(name: str):
    spec = importlib.util.spec_from_file_location(f"_dlo_test_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load_worker("ddp_cases")  # make_model, global_batches, train, flat_params: shared with the workers


def _by_case(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["case"], []).append(r)
    assert all([r["rank"] for r in rs] == [0, 1] for rs in out.values()), "every case must be reported by both ranks"
    return out


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    records = launch_forked(SCRIPTS / "ddp_cases.py", nproc=2, records_dir=tmp_path_factory.mktemp("ddp_cases"),
                     timeout_s=150)
    return _by_case(records)


@pytest.fixture(scope="module")
def unused_runs(tmp_path_factory):
    records = launch_forked(SCRIPTS / "ddp_unused.py", nproc=2, records_dir=tmp_path_factory.mktemp("ddp_unused"),
                     timeout_s=150)
    return _by_case(records)


def _single_process(kind: str, **kwargs) -> torch.Tensor:
    return torch.tensor(W.flat_params(W.train(W.make_model(kind), W.global_batches(), **kwargs)), dtype=torch.float64)


def _params(record: dict) -> torch.Tensor:
    return torch.tensor(record["params"], dtype=torch.float64)


# ----------------------------------------------------------------------------------------------------
# DDP == one process on the concatenated batch (and the ways to break it)
# ----------------------------------------------------------------------------------------------------
@distributed
def test_ddp_matches_single_process_on_the_global_batch(train_runs):
    ranks = train_runs["plain"]
    assert ranks[0]["params"] == ranks[1]["params"]  # the copies never drift apart: bit-identical
    reference = _single_process("mlp")
    torch.testing.assert_close(_params(ranks[0]), reference, rtol=1e-5, atol=1e-6)
    initial = torch.tensor(W.flat_params(W.make_model("mlp")), dtype=torch.float64)
    assert (reference - initial).abs().max() > 1e-2  # the steps really moved the weights


@distributed
def test_dividing_the_loss_by_world_size_again_halves_the_gradients(train_runs):
    """DDP already averages; ``loss / world_size`` on top is the same as training with lr / world_size."""
    wrong = _params(train_runs["double"][0])
    reference = _single_process("mlp")
    assert (wrong - reference).abs().max() > 1e-3
    torch.testing.assert_close(wrong, _single_process("mlp", lr=W.LR / 2), rtol=1e-5, atol=1e-6)


@distributed
def test_plain_batchnorm_under_ddp_uses_per_rank_statistics(train_runs):
    """Each rank normalises with the mean/var of its own half: not the single-process model, though
    the two ranks still agree with each other (the gradients are averaged)."""
    ranks = train_runs["bn"]
    assert ranks[0]["params"] == ranks[1]["params"]
    assert (_params(ranks[0]) - _single_process("bn")).abs().max() > 1e-4


@distributed
def test_syncbatchnorm_is_gpu_only_and_matches_single_process_there(train_runs):
    ranks = train_runs["syncbn"]
    if ranks[0]["device"] == "cpu":  # pin the limitation the notebook mentions
        assert all(r["error"] == "ValueError: SyncBatchNorm layers only work with GPU modules" for r in ranks)
        return
    assert ranks[0]["params"] == ranks[1]["params"]
    torch.testing.assert_close(_params(ranks[0]), _single_process("bn"), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# The communication view
# ----------------------------------------------------------------------------------------------------
@distributed
def test_comm_recorder_hook_gives_the_default_result(train_runs):
    for rank in (0, 1):
        hooked, default = _params(train_runs["hook"][rank]), _params(train_runs["plain"][rank])
        torch.testing.assert_close(hooked, default, rtol=0, atol=0)  # same division, same all-reduce


@distributed
def test_comm_recorder_records_every_bucket(train_runs):
    n_elements = sum(p.numel() for p in W.make_model("mlp").parameters())
    names = {name for name, _ in W.make_model("mlp").named_parameters()}
    for r in train_runs["hook"]:
        records, summary = r["records"], r["summary"]
        assert [s["step"] for s in summary] == list(range(W.STEPS))  # counted by the recorder itself
        for s in summary:
            assert s["elements"] == n_elements and s["bytes"] == 4 * n_elements
            assert s["comm_s"] > 0 and s["span_s"] > 0
        for rec in records:
            assert rec["bytes"] > 0 and rec["comm_s"] > 0 and rec["end_s"] >= rec["start_s"] >= 0
            assert rec["dtype"] == "float32" and rec["device"] == "cpu"
        for step in range(W.STEPS):
            in_step = [rec for rec in records if rec["step"] == step]
            assert sorted(rec["bucket"] for rec in in_step) == list(range(len(in_step)))
            assert {n for rec in in_step for n in rec["param_names"]} == names


@distributed
def test_smaller_bucket_cap_gives_more_buckets(train_runs):
    for r in train_runs["buckets"]:
        total = r["param_elements"]
        small, large = r["caps"]["0.02"]["summary"], r["caps"]["25"]["summary"]
        assert all(s["elements"] == total for s in small + large)
        # step 0: one bucket whatever the cap (torch 2.x, before the rebuild); at most a few with other versions
        assert small[0]["buckets"] <= small[1]["buckets"]
        assert [s["buckets"] for s in large[1:]] == [1, 1]  # ~150 KB of gradients fit in one 25 MiB bucket
        assert all(s["buckets"] >= 3 for s in small[1:])  # 20 KiB buckets: several all-reduces per step
        # after the rebuild, bucket 0 holds the last layer: its gradients are ready first
        first = [rec for rec in r["caps"]["0.02"]["records"] if rec["step"] == 1 and rec["bucket"] == 0][0]
        last_linear = len(W.make_model("wide")) - 1
        assert f"{last_linear}.weight" in first["param_names"]


# ----------------------------------------------------------------------------------------------------
# Metrics across ranks
# ----------------------------------------------------------------------------------------------------
@distributed
def test_reduce_mean_and_sum_on_two_ranks(train_runs):
    for r in train_runs["reduce"]:
        assert r["mean_float"] == 1.5  # (1 + 2) / 2
        assert r["mean_tensor"] == [1.5, 5.0]
        assert r["sum_int_tensor"] == 3


def test_reduce_helpers_without_process_group_are_identity():
    t = torch.tensor([1.0, 2.0])
    out = reduce_sum(t)
    assert torch.equal(out, t) and out is not t
    assert reduce_mean(3) == 3.0 and isinstance(reduce_mean(3), float)
    assert torch.equal(reduce_mean(torch.tensor([1, 2])), torch.tensor([1.0, 2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="tensor or a number"):
        reduce_sum("1.0")


def test_ddp_wrap_and_recorder_without_process_group():
    model = nn.Linear(2, 2)
    assert ddp_wrap(model) is model  # a plain single process: same script, no DDP
    with pytest.raises(ValueError, match="DistributedDataParallel"):
        attach_comm_recorder(model)


# ----------------------------------------------------------------------------------------------------
# Batch sizes
# ----------------------------------------------------------------------------------------------------
def test_check_batch_divisible_says_what_to_do():
    check_batch_divisible(256, 4)
    assert per_rank_batch(256, 4) == 64
    with pytest.raises(ValueError) as err:
        check_batch_divisible(250, 4)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("global batch 250 is not divisible by world size 4: choose a multiple of 4 (e.g. 248 or 252)")
    with pytest.raises(ValueError, match="not divisible"):
        per_rank_batch(10, 3)
    with pytest.raises(ValueError, match="positive integer"):
        check_batch_divisible(0, 2)
    with pytest.raises(ValueError, match="world size must be a positive integer"):
        per_rank_batch(8, 0)


# ----------------------------------------------------------------------------------------------------
# DistributedSampler: who sees which sample (one process, explicit num_replicas / rank)
# ----------------------------------------------------------------------------------------------------
def _epoch(n: int, world: int, epoch: int | None = None, **kwargs) -> list[list[int]]:
    out = []
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0, **kwargs)
        if epoch is not None:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_distributed_sampler_covers_the_dataset_once_per_epoch():
    parts = _epoch(12, 3, epoch=0)
    assert [len(p) for p in parts] == [4, 4, 4]
    every = [i for p in parts for i in p]
    assert sorted(every) == list(range(12))  # union = everything, no duplicates


def test_distributed_sampler_pads_by_repeating_when_not_divisible():
    """10 samples on 4 ranks: each rank gets ceil(10 / 4) = 3, so 2 samples are seen twice per epoch
    (the first indices of the shuffled list are appended again). drop_last=True drops 2 instead."""
    parts = _epoch(10, 4, epoch=0)
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    counts = Counter(i for p in parts for i in p)
    assert set(counts) == set(range(10)) and sorted(counts.values()) == [1] * 8 + [2] * 2
    dropped = _epoch(10, 4, epoch=0, drop_last=True)
    seen = [i for p in dropped for i in p]
    assert [len(p) for p in dropped] == [2, 2, 2, 2] and len(set(seen)) == 8


def test_set_epoch_reshuffles_and_forgetting_it_repeats_the_order():
    e0, e1 = _epoch(12, 2, epoch=0), _epoch(12, 2, epoch=1)
    assert e0[0] != e1[0]  # a new order each epoch...
    assert sorted(e1[0] + e1[1]) == list(range(12))  # ...still covering everything
    # The pitfall: without set_epoch, every epoch replays the same "shuffled" order.
    sampler = DistributedSampler(range(12), num_replicas=2, rank=0, shuffle=True, seed=0)
    assert list(sampler) == list(sampler) == e0[0]


# ----------------------------------------------------------------------------------------------------
# find_unused_parameters: conditional heads vs stochastic depth
# ----------------------------------------------------------------------------------------------------
@distributed
def test_conditional_heads_need_find_unused_parameters(unused_runs):
    for r in unused_runs["heads_error"]:
        assert r["steps_done"] == 1  # the first step "works"; the next forward raises
        assert r["error"].startswith(
            "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one"
        )
        assert r["mentions_flag"]
    for r in unused_runs["heads_flag"]:
        assert r["steps_done"] == 3 and r["error"] is None and r["same_on_all_ranks"]


@distributed
def test_stochastic_depth_trains_under_ddp_without_the_flag(unused_runs):
    for r in unused_runs["stochastic"]:
        assert r["steps_done"] == 3 and r["same_on_all_ranks"]
        assert r["params_changed"] == r["params_total"]


def test_conditional_heads_net_uses_one_head_per_call():
    net = ConditionalHeadsNet(num_classes=5, width=4)
    x = torch.randn(2, 3, 8, 8)
    net(x, head="b").sum().backward()
    assert net.heads["a"].weight.grad is None and net.heads["b"].weight.grad is not None
    assert torch.equal(net(x, head=0), net(x, head="a"))
    with pytest.raises(ValueError, match="unknown head"):
        net(x, head="c")


def test_stochastic_depth_matches_torchvision_and_reaches_every_parameter():
    import torchvision.ops

    x = torch.randn(16, 3, 4, 4)
    torch.manual_seed(3)
    ours = stochastic_depth(x, 0.5, training=True)
    torch.manual_seed(3)
    theirs = torchvision.ops.stochastic_depth(x, 0.5, mode="row", training=True)
    assert torch.equal(ours, theirs)
    assert stochastic_depth(x, 0.5, training=False) is x

    torch.manual_seed(0)
    net = StochasticDepthNet(num_classes=10, width=4, depth=2, p=0.9)
    net(torch.randn(4, 3, 8, 8)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())  # dropped blocks get zeros, not None
    net.eval()
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(net(x), net(x))


def test_first_line():
    assert first_line(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert first_line(ValueError()) == "ValueError"
