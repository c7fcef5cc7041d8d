"""The bucket picture draws the plan the dp_scratch bucket step computes (the solution's ``plan_buckets``), for
the models of Jour2/dp_scratch.ipynb and Jour2/ddp.ipynb and two bucket sizes each, and its all-reduces start
once their last gradient is ready, one at a time."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

import dlo  # noqa: F401
from dlo.course.exercises import load_exercises
from dlo.lessons.figures.buckets import bucket_plan, bucket_schedule, buckets_figure, drawn_buckets, parameter_sizes
from dlo.models import MLP, resnet18_cifar

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def solution():
    return load_exercises(ROOT / "Jour2" / "dp_scratch_train.py")


MODELS = {
    "dp_scratch smoke MLP": (lambda: MLP(in_features=3 * 16 * 16, hidden=(512,) * 5, num_classes=10), (1, 2)),
    "ddp smoke ResNet-18": (lambda: resnet18_cifar(width=8), (0.05, 0.2)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_drawn_buckets_are_the_plan_of_the_bucket_step(name, solution):
    make, caps = MODELS[name]
    model = make()
    params = [p for p in model.parameters() if p.requires_grad]
    for cap in caps:
        want = [sorted(b) for b in solution["plan_buckets"](params, int(cap * 2**20))]
        assert len(want) > 1, f"{name}, {cap} MiB: pick a cap that makes several buckets"
        assert drawn_buckets(buckets_figure(model, cap)) == want, (name, cap)


def test_bf16_parameters_count_their_bytes(solution):
    params = [torch.zeros(100, dtype=torch.bfloat16), torch.zeros(100), torch.zeros(50, dtype=torch.float64)]
    sizes = [b for _, b in parameter_sizes([(str(i), p.numel() * p.element_size()) for i, p in enumerate(params)])]
    for cap in (200, 400, 1000):
        assert [sorted(b) for b in bucket_plan(sizes, cap)] == [sorted(b) for b in solution["plan_buckets"](params, cap)]


def test_an_all_reduce_starts_when_its_last_gradient_is_ready_and_after_the_previous_one():
    sizes = [10, 40, 20, 30]
    plan = bucket_plan(sizes, 45)
    assert plan == [[3, 2], [1, 0]]
    sched = bucket_schedule(sizes, plan, comm_per_byte=0.5)
    assert [s["start"] for s in sched] == [50, max(100, 50 + 25)]
    assert sched[0]["end"] <= sched[1]["start"]
