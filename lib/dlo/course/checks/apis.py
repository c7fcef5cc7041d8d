"""Checker of tp_fsdp/apis.ipynb's exercise (``dlo check apis fabric_port``): a native training loop with gradient
accumulation, ported to Lightning Fabric.

The student's ``fabric_loop`` runs in this process on a one-device CPU ``Fabric`` and is compared with the native
loop (:func:`native_loop`, the notebook's) on the same model, data and seed: the losses it returns and the
weights after the last step must be equal, in two set-ups (two seeds, accumulation 1 and 3, a last batch smaller
than the others, SGD with momentum so that an extra or a missing optimizer step shows). On one CPU device Fabric
changes nothing numerically, which is why a port that skips Fabric's API still trains the same here and would
not on several GPUs: what the API must be given is checked from the calls it received (the ``Fabric`` handed to
the loop records them), each failure saying what would go wrong at scale. Known mistakes of the accumulation
(an optimizer step per micro-batch, a loss not divided, gradients never zeroed) are named from the weights they
give, replayed natively.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.apis_core import missing_library

NOTEBOOK = "tp_fsdp/apis.ipynb"
#: (seed, accumulate, steps, batch size, samples): the last set-up ends on a short batch (14 = 4 + 4 + 4 + 2).
SETUPS = ((0, 1, 3, 4, 12), (1, 3, 1, 4, 14), (2, 3, 2, 3, 18))


def native_loop(model: nn.Module, optimizer: Any, loader: DataLoader, accumulate: int, steps: int, *,
                step_every_micro_batch: bool = False, divide: bool = True, zero: bool = True) -> list[float]:
    """The notebook's native loop (one device); the keyword arguments replay the usual mistakes of a port."""
    losses, batches = [], iter(loader)
    for _ in range(steps):
        total = 0.0
        for _ in range(accumulate):
            x, y = next(batches)
            loss = F.cross_entropy(model(x), y) / (accumulate if divide else 1)
            loss.backward()
            total += loss.item()
            if step_every_micro_batch:
                optimizer.step()
                if zero:
                    optimizer.zero_grad()
        if not step_every_micro_batch:
            optimizer.step()
            if zero:
                optimizer.zero_grad()
        losses.append(total)
    return losses


def _setup(seed: int, batch: int, samples: int) -> tuple[nn.Module, Any, DataLoader]:
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(samples, 6, generator=g), torch.randint(0, 3, (samples,), generator=g))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return model, optimizer, DataLoader(data, batch_size=batch, shuffle=False)


def _spy_fabric():
    """A one-device CPU Fabric that records what the loop asked of it."""
    from lightning_fabric import Fabric

    class SpyFabric(Fabric):
        def __init__(self) -> None:
            super().__init__(accelerator="cpu", devices=1, precision="32-true")
            self.calls: dict[str, int] = {"backward": 0, "setup_dataloaders": 0, "no_backward_sync": 0}
            self.given: list[Any] = []  # what setup / setup_module / setup_optimizers received
            self.inside_setup = False

        def _given(self, method: Callable, *objects: Any, **kwargs: Any) -> Any:
            self.given.extend(objects)
            self.inside_setup = True
            try:
                return method(*objects, **kwargs)
            finally:
                self.inside_setup = False

        def setup(self, module, *optimizers, **kwargs):
            return self._given(super().setup, module, *optimizers, **kwargs)

        def setup_module(self, module, *args, **kwargs):
            return self._given(super().setup_module, module, *args, **kwargs)

        def setup_optimizers(self, *optimizers):
            return self._given(super().setup_optimizers, *optimizers)

        def setup_dataloaders(self, *loaders, **kwargs):
            self.calls["setup_dataloaders"] += 1
            return super().setup_dataloaders(*loaders, **kwargs)

        def backward(self, tensor, *args, **kwargs):
            self.calls["backward"] += 1
            return super().backward(tensor, *args, **kwargs)

        def no_backward_sync(self, module, enabled: bool = True):
            self.calls["no_backward_sync"] += 1
            return super().no_backward_sync(module, enabled=enabled)

    return SpyFabric()


def _watch_moves(model: nn.Module, fabric: Any) -> list[str]:
    """Calls of model.to / .cuda / .cpu made by the loop itself (Fabric's own move, inside setup, not counted)."""
    moved: list[str] = []
    for name in ("to", "cuda", "cpu"):
        original = getattr(model, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            if not fabric.inside_setup:
                moved.append(_name)
            return _original(*args, **kwargs)

        setattr(model, name, spy)
    return moved


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=1e-6, rtol=1e-5) for x, y in zip(a, b))


def _accumulation_problem(got: list[torch.Tensor], setup: tuple) -> str:
    seed, accumulate, steps, batch, samples = setup
    mistakes = (({"step_every_micro_batch": True}, "the optimizer steps after every micro-batch: with accumulation it "
                 "steps once per `accumulate` micro-batches, on their summed gradients"),
                ({"divide": False}, "the loss is not divided by `accumulate`: the accumulated gradient is the sum "
                 "of the micro-batches' mean gradients, `accumulate` times the gradient of the whole batch"),
                ({"zero": False}, "the gradients are never zeroed after a step: each step adds the previous ones' "
                 "gradients to its own"))
    for kwargs, words in mistakes:
        model, optimizer, loader = _setup(seed, batch, samples)
        native_loop(model, optimizer, loader, accumulate, steps, **kwargs)
        if _same(got, _weights(model)):
            return words
    return "the weights after the last step differ from the native loop's"


def _run(fabric_loop: Callable, setup: tuple) -> tuple[Any, list, Any, list[str], Any, Any]:
    seed, accumulate, steps, batch, samples = setup
    fabric = _spy_fabric()
    model, optimizer, loader = _setup(seed, batch, samples)
    moved = _watch_moves(model, fabric)
    try:
        losses = fabric_loop(fabric, model, optimizer, loader, accumulate, steps)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the student's error, in one line
        raise CheckFailed(f"fabric_loop (accumulate={accumulate}, steps={steps}) raised {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return fabric, losses, model, moved, optimizer, loader


def _api_problem(fabric: Any, model: nn.Module, optimizer: Any, moved: list[str], accumulate: int, steps: int) -> str | None:
    if model not in fabric.given:
        return ("the model never went through fabric.setup (or setup_module): on GPUs it would stay where it was "
                "created, unwrapped (no DDP / FSDP, no mixed precision)")
    if optimizer not in fabric.given:
        return ("the optimizer was not set up with the model (fabric.setup(model, optimizer)): with FSDP or mixed "
                "precision Fabric must wrap it, or it steps on parameters that are not the ones trained")
    if moved:
        return (f"the loop moves the model itself (model.{moved[0]}(...)): Fabric places it on its device in "
                "setup; a hand-written move breaks on another accelerator or under FSDP, which shards it first")
    if fabric.calls["setup_dataloaders"] == 0:
        return ("the DataLoader was not set up with fabric.setup_dataloaders: on N processes it would not get a "
                "DistributedSampler, so every process would train on the whole dataset (N times the same batches)")
    if fabric.calls["backward"] != accumulate * steps:
        return (f"fabric.backward ran {fabric.calls['backward']} time(s) for {accumulate * steps} micro-batches: "
                "give each micro-batch's loss to Fabric's backward rather than calling its own -- Fabric scales the "
                "loss for mixed precision and lets the strategy (DDP, FSDP, DeepSpeed) run its backward")
    return None


@register("apis", "fabric_port", ("fabric_loop",), NOTEBOOK)
def _check_fabric_port(fabric_loop: Callable) -> str:
    missing = missing_library("lightning_fabric")  # a GPU node may lack it: the check runs a real Fabric
    if missing:
        raise RuntimeError(f"apis/fabric_port cannot be checked here: {missing}")
    for setup in SETUPS:
        seed, accumulate, steps, batch, samples = setup
        fabric, losses, model, moved, optimizer, _ = _run(fabric_loop, setup)
        ref_model, ref_optimizer, ref_loader = _setup(seed, batch, samples)
        want = native_loop(ref_model, ref_optimizer, ref_loader, accumulate, steps)
        where = f"seed {seed}, accumulate={accumulate}, {steps} step(s)"
        problem = _api_problem(fabric, model, optimizer, moved, accumulate, steps)
        expect(problem is None, f"{where}: {problem}")
        got = _weights(model)
        if not _same(got, _weights(ref_model)):
            raise CheckFailed(f"{where}: {_accumulation_problem(got, setup)}")
        expect(isinstance(losses, (list, tuple)) and len(losses) == steps,
               f"{where}: return one loss per optimizer step ({steps}), got {losses!r}")
        values = [float(v) for v in losses]
        expect(all(abs(a - b) < 1e-5 for a, b in zip(values, want)),
               f"{where}: the returned losses {[round(v, 5) for v in values]} differ from the native loop's "
               f"{[round(v, 5) for v in want]}: each is the step's loss over its {accumulate} micro-batch(es), as the "
               "native loop records it")
    return ("the Fabric port trains exactly as the native loop (weights and losses, 3 set-ups, accumulation 1 and 3); "
            "model and optimizer set up together, the loader set up, every backward through Fabric")
