"""The FSDP unit timeline is drawn from the units the exercise makes: the modules that tp_fsdp/fsdp_train.py's
``apply_fsdp`` passes to ``fully_shard`` (each decoder layer, then the root), for more than one layer count; and
``reshard_after_forward=False`` leaves no all-gather in backward."""
from __future__ import annotations

import dataclasses

import matplotlib
import pytest

matplotlib.use("Agg")

import torch.distributed.fsdp as torch_fsdp  # noqa: E402

from dlo.course.exercises import load_exercises  # noqa: E402
from dlo.lessons.figures.fsdp import ROOT, fsdp_units, unit_timeline  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402
from dlo.parallel import fsdp as ref  # noqa: E402
from dlo.runtime.paths import ROOT as PROJECT  # noqa: E402


def _wrapped_by_the_exercise(model) -> list[str]:
    """The modules the solution's apply_fsdp gives to fully_shard, in call order (recorded, nothing sharded)."""
    names = {id(m): (name or ROOT) for name, m in model.named_modules()}
    calls = []
    real = torch_fsdp.fully_shard
    torch_fsdp.fully_shard = lambda module, **kwargs: calls.append(names[id(module)]) or module
    try:
        load_exercises(PROJECT / "tp_fsdp" / "fsdp_train.py")["apply_fsdp"](model)
    finally:
        torch_fsdp.fully_shard = real
    return calls


def _spans(fig, phase, stream):
    return [d["tag"][2] for d in drawn(fig, "box")
            if isinstance(d["tag"], tuple) and d["tag"][:2] == (phase, stream)]


@pytest.mark.parametrize("layers", [2, 3])
def test_the_drawn_units_are_the_modules_the_exercise_wraps(layers):
    cfg = dataclasses.replace(ref.model_config("smoke"), num_layers=layers)
    model = ref.build_llama(cfg)
    wrapped = _wrapped_by_the_exercise(model)
    assert wrapped == fsdp_units(model) and len(wrapped) == layers + 1
    fig = unit_timeline(model)
    layer_units = wrapped[:-1]
    # forward: the root first, then each layer gathered and computed in order, the root again (the head)
    assert _spans(fig, "forward", "compute") == [ROOT, *layer_units, ROOT]
    assert _spans(fig, "forward", "all-gather") == [ROOT, *layer_units]
    assert _spans(fig, "forward", "free") == layer_units
    # backward: the layers in reverse, each gathered again, computed, its gradients reduce-scattered; the root last
    assert _spans(fig, "backward", "compute") == [ROOT, *reversed(layer_units), ROOT]
    assert _spans(fig, "backward", "all-gather") == list(reversed(layer_units))
    assert _spans(fig, "backward", "reduce-scatter") == [*reversed(layer_units), ROOT]
    assert sorted(set(_spans(fig, "forward", "compute"))) == sorted(wrapped)
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("layers", [2, 4])
def test_without_reshard_after_forward_backward_gathers_nothing(layers):
    units = [f"model.layers.{i}" for i in range(layers)] + [ROOT]
    fig = unit_timeline(units, reshard_after_forward=False)
    assert _spans(fig, "backward", "all-gather") == []
    assert _spans(fig, "forward", "free") == []
    assert _spans(fig, "backward", "reduce-scatter") == [*reversed(units[:-1]), ROOT]
    matplotlib.pyplot.close(fig)


def test_prefetching_puts_each_all_gather_under_the_previous_units_compute(tmp_path):
    units = [f"model.layers.{i}" for i in range(3)] + [ROOT]
    fig = unit_timeline(units, path=tmp_path / "fsdp.png")
    boxes = {d["tag"]: d for d in drawn(fig, "box") if isinstance(d["tag"], tuple)}
    for i in range(1, 3):  # layer i's forward all-gather starts with layer i-1's compute
        assert boxes[("forward", "all-gather", f"model.layers.{i}")]["x"] == \
            boxes[("forward", "compute", f"model.layers.{i - 1}")]["x"]
    assert (tmp_path / "fsdp.png").stat().st_size > 0
    matplotlib.pyplot.close(fig)
