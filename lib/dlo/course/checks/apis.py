"""Checker of tp_fsdp/apis.ipynb's exercise (``dlo check apis fabric_port``): a native training loop with gradient
accumulation, ported to Lightning Fabric.

The student's ``fabric_loop`` runs in this process on a one-device CPU ``Fabric`` and is compared with the native
loop (:func:`native_loop`, the notebook's) on the same model, data and seed: the losses it returns and the
weights after the last step must be equal, in two set-ups (two seeds, accumulation 1 and 3, a last batch smaller
than the others, SGD with momentum so that an extra or a missing optimizer step shows). On one CPU device Fabric
changes nothing numerically, which is why a port that skips Fabric's API still trains the same here and would
not on several GPUs: what the API must be given (model and optimizer set up together, no hand-written move, every
backward through Fabric) is checked from the calls it received. Known mistakes of the accumulation (an optimizer
step per micro-batch, a loss not divided, gradients never zeroed) are named from the weights they give, replayed
natively.

What only several processes show is checked from its effects, on 2 gloo processes (:mod:`dlo.course.checks.
apis_worker`): the answer and the reference (:func:`reference_loop`, the notebook's solution) train on a 2-process
DDP Fabric, and each rank records the sample ids of every batch it iterated (its share of the data: the loader set
up by Fabric, with its distributed sampler, is the one iterated), the micro-batches after which its gradients were
all-reduced (a DDP communication hook: exactly the last micro-batch of each step), its losses and its final weights,
compared with the reference's on the same rank.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from dlo.course.exercises import write_answer
from dlo.course.checks.framework import CheckFailed, expect, peer_records, register
from dlo.lessons.apis_core import missing_library

NOTEBOOK = "tp_fsdp/apis.ipynb"
WORKER = Path(__file__).with_name("apis_worker.py")
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


#: The 2-process set-ups (seed, accumulate, steps, batch size, samples): each rank's share is 11 samples (22) or 18
#: (35: one padded), so a rank's last batch is short in the first, and a loader not set up shows in what it iterates.
PEER_SETUPS = ((3, 3, 2, 2, 22), (4, 2, 3, 3, 35))


def reference_loop(fabric: Any, model: nn.Module, optimizer: Any, loader: DataLoader, accumulate: int,
                   steps: int) -> list[float]:
    """The notebook's solution: the native loop ported to Fabric (what the answer is compared with)."""
    model, optimizer = fabric.setup(model, optimizer)
    batches = iter(fabric.setup_dataloaders(loader))
    history = []
    for _ in range(steps):
        step_loss = 0.0
        for micro in range(accumulate):
            inputs, targets = next(batches)
            with fabric.no_backward_sync(model, enabled=micro < accumulate - 1):
                micro_loss = F.cross_entropy(model(inputs), targets) / accumulate
                fabric.backward(micro_loss)
            step_loss += micro_loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        history.append(step_loss)
    return history


class _Log:
    """What one run iterated (the sample ids of each batch collated) and after which micro-batches it synced."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.batches: list[list[int]] = []
        self.synced: set[int] = set()

    def collate(self, items: list) -> Any:
        self.batches.append(self.pending)
        self.pending = []
        return default_collate(items)


class _LoggedData(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, log: _Log) -> None:
        self.x, self.y, self.log = x, y, log

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.log.pending.append(int(i))
        return self.x[i], self.y[i]


def logged_setup(seed: int, batch: int, samples: int) -> tuple[nn.Module, Any, DataLoader, _Log]:
    """:func:`_setup`'s model, optimizer and data, the loader's dataset recording the ids it is asked for (the
    loader set up by Fabric re-uses the dataset and the collate function, so either loader's batches are logged)."""
    model, optimizer, plain = _setup(seed, batch, samples)
    log = _Log()
    x, y = plain.dataset.tensors
    return model, optimizer, DataLoader(_LoggedData(x, y, log), batch_size=batch, collate_fn=log.collate), log


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
    if fabric.calls["backward"] != accumulate * steps:
        return (f"fabric.backward ran {fabric.calls['backward']} time(s) for {accumulate * steps} micro-batches: "
                "give each micro-batch's loss to Fabric's backward rather than calling its own -- Fabric scales the "
                "loss for mixed precision and lets the strategy (DDP, FSDP, DeepSpeed) run its backward")
    return None


def _peer_problem(rank: int, setup: tuple, answer: dict, reference: dict) -> str | None:
    """What differs between the answer's and the reference's run on one rank of 2: the batches iterated, the
    micro-batches after which the gradients were all-reduced, the final weights, the losses. None: nothing."""
    seed, accumulate, steps, batch, samples = setup
    where = f"2 processes, accumulate={accumulate}, {steps} steps, {samples} samples in batches of {batch}, rank {rank}"
    if "error" in answer:
        return f"{where}: fabric_loop raised {answer['error']}"
    got, want = answer["batches"], reference["batches"]
    if got != want:
        everything = [list(range(i, min(i + batch, samples))) for i in range(0, samples, batch)]
        if got == everything[:len(got)]:
            return (f"{where}: this rank iterated every sample of the dataset in order (batches {got[:2]}...) instead "
                    f"of its share ({want[:2]}...): iterate the loader fabric.setup_dataloaders returned, with its "
                    "distributed sampler, or every rank trains on the whole dataset")
        return f"{where}: this rank iterated the batches {got}, expected {want}"
    if answer["synced"] != reference["synced"]:
        got, want = answer["synced"], reference["synced"]
        if len(got) == len(answer["batches"]):
            why = ("every micro-batch: use fabric.no_backward_sync(model, enabled=...) to skip the all-reduce on the "
                   "micro-batches that only accumulate")
        elif not got:
            why = "no micro-batch at all: the ranks never average their gradients and drift apart"
        else:
            why = "other micro-batches than the last of each step"
        return (f"{where}: the gradients were all-reduced after micro-batches {got}, expected after {want} only (the "
                f"last of each step's {accumulate}); here after {why}")
    diff = max((abs(a - b) for ga, gb in zip(answer["weights"], reference["weights"]) for a, b in zip(ga, gb)),
               default=float("inf"))
    if len(answer["weights"]) != len(reference["weights"]) or not diff <= 1e-5:
        return f"{where}: the weights after the last step differ from the reference's by up to {diff:.3g}"
    if len(answer["losses"]) != steps or any(abs(a - b) > 1e-5 for a, b in zip(answer["losses"], reference["losses"])):
        return (f"{where}: the returned losses {[round(v, 5) for v in answer['losses']]} differ from the reference's "
                f"{[round(v, 5) for v in reference['losses']]} (this rank's loss of each step)")
    return None


def _check_on_two_processes(fabric_loop: Callable) -> None:
    """The answer and the reference trained on 2 gloo processes (:mod:`dlo.course.checks.apis_worker`)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            answer = write_answer(fabric_loop, Path(tmp), "fabric_loop")
        except ValueError as exc:
            raise CheckFailed(str(exc)) from None
        records = peer_records(WORKER, [str(answer)], 2, timeout_s=180)
    for record in records:
        for run in record["runs"]:
            if run["answer"].get("error", "").startswith("NotImplementedError"):
                raise NotImplementedError(run["answer"]["error"].split(":", 1)[-1].strip())
    for i, setup in enumerate(PEER_SETUPS):
        for record in records:
            if i < len(record["runs"]):
                run = record["runs"][i]
                problem = _peer_problem(record["rank"], setup, run["answer"], run["reference"])
                expect(problem is None, problem or "")


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
    _check_on_two_processes(fabric_loop)
    return ("the Fabric port trains exactly as the native loop (weights and losses, 3 set-ups, accumulation 1 and 3); "
            "model and optimizer set up together, every backward through Fabric; on 2 processes each rank iterates "
            "its share of the data, all-reduces only on each step's last micro-batch and ends on the reference's "
            "weights")
