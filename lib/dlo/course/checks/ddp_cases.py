"""Generated cases and the checker's own references for ``dlo check ddp <step>`` (Jour2/ddp_train.py).

Every case is drawn by :func:`dlo.course.checks.cases.seeded` (fixed edge cases plus drawn ones, smallest first, the
same on every run), over what correctness depends on:

* ``device``: nodes of 1, 2, 4 or 8 GPUs running 1 to that many processes each, one to three nodes, every kind of
  rank (first node, later nodes, a node not full);
* ``wrap``: with and without BatchNorm, one process or several, ``sync_bn`` on and off, ``bucket_cap_mb`` left at its
  default, whole or fractional, ``find_unused_parameters`` True, False or left at its default;
* ``shard``: world sizes 1 to 4 (3 odd), datasets whose length is a multiple of neither the world size nor the batch,
  several seeds, three epochs each (the sampler's ``set_epoch``), global batches that do not split;
* ``epoch``: three consecutive epochs from several starting numbers, on world sizes 1 to 3 (any rank), datasets with
  a last, smaller batch, fp32 and fp64 models;
* ``reduce``: per-rank totals of different sizes (and equal ones), loss sums with more digits than float32 holds,
  on 3 and then 2 gloo processes, all cases in one launch per world size.
"""
from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dlo.course.checks.cases import Case, seeded
from dlo.runtime.context import DistContext


def context(rank: int, world: int, per_node: int) -> DistContext:
    """The DistContext torchrun gives process ``rank`` of ``world``, ``per_node`` processes per node."""
    return DistContext(rank=rank, local_rank=rank % per_node, world_size=world, local_world_size=min(world, per_node),
                       master_addr="127.0.0.1", master_port=29500, source="torchrun" if world > 1 else "single",
                       node_rank=rank // per_node)


# ----------------------------------------------------------------------------------------------------
# device
# ----------------------------------------------------------------------------------------------------
def _device_case(rank: int, nodes: int, per_node: int, gpus: int) -> Case:
    world = nodes * per_node
    ctx = context(rank, world, per_node)
    return Case(f"rank {rank} of {world}, {per_node} process(es) on each node of {gpus} GPUs (local_rank "
                f"{ctx.local_rank})", {"ctx": ctx, "gpus": gpus}, world + rank / 100)


def device_cases() -> list[Case]:
    def draw(rng: random.Random) -> Case:
        gpus = rng.choice((1, 2, 4, 8))
        per_node, nodes = rng.randint(1, gpus), rng.randint(1, 3)
        return _device_case(rng.randrange(nodes * per_node), nodes, per_node, gpus)

    fixed = [_device_case(5, 2, 4, 4), _device_case(3, 2, 2, 4), _device_case(2, 1, 3, 8), _device_case(0, 1, 1, 1)]
    return seeded(draw, 10, seed=1, fixed=fixed)


# ----------------------------------------------------------------------------------------------------
# wrap
# ----------------------------------------------------------------------------------------------------
class BNNet(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def make_model(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "bn":
        return BNNet(3 + seed % 3)
    return nn.Sequential(nn.Linear(5, 4 + seed % 3), nn.ReLU(), nn.Linear(4 + seed % 3, 2))


def _wrap_case(kind: str, world: int, sync_bn: bool, mb: float | None, unused: bool | None, seed: int) -> Case:
    options: dict[str, Any] = {"sync_bn": sync_bn}
    if mb is not None:
        options["bucket_cap_mb"] = mb
    if unused is not None:
        options["find_unused_parameters"] = unused
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    model = "a model with BatchNorm" if kind == "bn" else "a model without BatchNorm"
    return Case(f"{world} process(es), {model}, {shown}", {"kind": kind, "world": world, "options": options,
                                                           "seed": seed}, world + len(options) / 10)


def wrap_cases() -> list[Case]:
    """Several processes with sync_bn=True cannot be built on CPUs (DDP refuses SyncBatchNorm there)."""
    def draw(rng: random.Random) -> Case:
        world = rng.choice((1, 2, 3))
        return _wrap_case(rng.choice(("bn", "mlp")), world, world == 1 and rng.random() < 0.5,
                          rng.choice((None, 1.0, 2.5, 0.25, 7.0)), rng.choice((None, True, False)), rng.randrange(9))

    fixed = [_wrap_case("bn", 1, False, None, None, 0), _wrap_case("bn", 1, True, None, None, 1),
             _wrap_case("bn", 2, False, 1.0, True, 2), _wrap_case("bn", 2, False, None, None, 3),
             _wrap_case("mlp", 3, False, 2.5, False, 4)]
    return seeded(draw, 6, seed=2, fixed=fixed)


def describe_wrapped(model: nn.Module, original: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What matters of a wrapped model, compared with the reference's."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    inner = model.module if isinstance(model, DDP) else model
    state = inner.state_dict()
    return {"ddp": isinstance(model, DDP),
            "device_ids": getattr(model, "device_ids", None) if isinstance(model, DDP) else None,
            "bucket_bytes_cap": getattr(model, "bucket_bytes_cap", None) if isinstance(model, DDP) else None,
            "find_unused": bool(getattr(model, "find_unused_parameters", False)) if isinstance(model, DDP) else None,
            "sync_bn": sum(isinstance(m, nn.SyncBatchNorm) for m in inner.modules()),
            "plain_bn": sum(isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
                            for m in inner.modules()),
            "same_weights": set(state) == set(original) and all(torch.equal(state[k], original[k]) for k in original)}


def expected_wrapped(case: Case) -> dict[str, Any]:
    options, world = case.kwargs["options"], case.kwargs["world"]
    bn = 1 if case.kwargs["kind"] == "bn" else 0
    sync = bn if options["sync_bn"] else 0
    distributed = world > 1
    return {"ddp": distributed, "device_ids": None,
            "bucket_bytes_cap": int(options.get("bucket_cap_mb", 25.0) * 1024 * 1024) if distributed else None,
            "find_unused": bool(options.get("find_unused_parameters", False)) if distributed else None,
            "sync_bn": sync, "plain_bn": bn - sync, "same_weights": True}


# ----------------------------------------------------------------------------------------------------
# shard
# ----------------------------------------------------------------------------------------------------
EPOCHS = (0, 1, 2)


def _shard_case(world: int, n: int, per_rank: int, seed: int) -> Case:
    return Case(f"world size {world}, {n} samples, global batch {per_rank * world}, seed {seed}",
                {"world": world, "n": n, "global_batch": per_rank * world, "seed": seed}, world * 100 + n)


def shard_cases() -> list[Case]:
    def draw(rng: random.Random) -> Case:
        world, per_rank = rng.choice((2, 3, 4)), rng.randint(1, 5)
        n = rng.randint(3 * world * per_rank, 60)
        while n % world == 0 or n % (world * per_rank) == 0:
            n += 1
        return _shard_case(world, n, per_rank, rng.randrange(10))

    fixed = [_shard_case(2, 40, 4, 3), _shard_case(2, 41, 1, 1), _shard_case(3, 31, 2, 0), _shard_case(1, 11, 3, 5)]
    return seeded(draw, 5, seed=3, fixed=fixed)


def reference_order(n: int, world: int, rank: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return list(sampler)


#: Global batches that do not split over the world size, by world size.
UNEVEN = ((2, 9), (3, 10), (3, 4), (4, 6))


# ----------------------------------------------------------------------------------------------------
# epoch
# ----------------------------------------------------------------------------------------------------
class RecordingDataset(Dataset):
    """(x, y) pairs that remember which indices were read, in order."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y, self.seen = x, y, []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.seen.append(int(i))
        return self.x[i], self.y[i]


class RecordingSampler(DistributedSampler):
    """A DistributedSampler that remembers its set_epoch calls and the epoch each order was drawn with."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[int] = []
        self.drawn_with: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(int(epoch))
        super().set_epoch(epoch)

    def __iter__(self):
        self.drawn_with.append(int(self.epoch))
        return super().__iter__()


def _epoch_case(world: int, rank: int, n: int, batch: int, start: int, seed: int, dtype: torch.dtype) -> Case:
    return Case(f"rank {rank} of {world}, {n} samples, batch {batch}, epochs {start}-{start + 2}, seed {seed}, "
                f"{str(dtype).replace('torch.', '')}",
                {"world": world, "rank": rank, "n": n, "batch": batch, "start": start, "seed": seed, "dtype": dtype},
                n + world)


def epoch_cases() -> list[Case]:
    def draw(rng: random.Random) -> Case:
        world, batch = rng.choice((1, 2, 3)), rng.randint(2, 5)
        n = rng.randint(world * batch + 1, 30)
        while (n // world) % batch == 0:
            n += 1
        return _epoch_case(world, rng.randrange(world), n, batch, rng.randint(0, 4), rng.randrange(10),
                           rng.choice((torch.float32, torch.float64)))

    fixed = [_epoch_case(1, 0, 12, 4, 3, 0, torch.float32), _epoch_case(2, 1, 23, 4, 0, 1, torch.float64)]
    return seeded(draw, 4, seed=4, fixed=fixed)


def epoch_setup(case: Case):
    """The dataset, sampler, loader, model, optimizer and criterion of one case (a fresh set on each call)."""
    k = case.kwargs
    g = torch.Generator().manual_seed(100 + k["seed"])
    data = RecordingDataset(torch.randn(k["n"], 5, generator=g, dtype=torch.float64).to(k["dtype"]),
                            torch.randint(0, 3, (k["n"],), generator=g))
    sampler = RecordingSampler(data, num_replicas=k["world"], rank=k["rank"], shuffle=True, seed=k["seed"],
                               drop_last=True)
    loader = DataLoader(data, batch_size=k["batch"], sampler=sampler)
    torch.manual_seed(k["seed"])
    model = nn.Linear(5, 3).to(k["dtype"])
    return data, sampler, loader, model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()


def reference_epoch(model, loader, sampler, epoch, optimizer, criterion) -> tuple[float, int, int]:
    """One epoch as the exercise asks: the sampler told the epoch first, then every batch once."""
    sampler.set_epoch(epoch)
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        logits = model(x)
        loss = criterion(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += float(loss.detach().double()) * len(y)
        correct += int((logits.argmax(dim=1) == y).sum())
        count += len(y)
    return loss_sum, correct, count


# ----------------------------------------------------------------------------------------------------
# reduce
# ----------------------------------------------------------------------------------------------------
def reduce_cases(world: int, n: int = 5) -> list[list[tuple[float, int, int]]]:
    """Per case, each rank's (loss sum, correct, count): shards of different sizes (one case of equal ones), loss sums
    with digits float32 cannot hold."""
    rng = random.Random(50 + world)
    cases = [[(5.1, 4, 10), (40.3, 27, 30), (17.7, 5, 20)][:world], [(12.3456789, 3, 8)] * world]
    for _ in range(n):
        rows = []
        for _ in range(world):
            count = rng.randint(1, 60)
            rows.append((round(count * rng.uniform(0.05, 3.0), 9), rng.randint(0, count), count))
        cases.append(rows)
    return cases


def reduce_reference(rows: list[tuple[float, int, int]]) -> dict[str, float]:
    total = sum(r[2] for r in rows)
    return {"loss": sum(r[0] for r in rows) / total, "accuracy": sum(r[1] for r in rows) / total}


def reduce_known(rows: list[tuple[float, int, int]], rank: int) -> dict[str, dict[str, float]]:
    """What the known mistakes return on ``rank``, by mistake."""
    total = sum(r[2] for r in rows)
    ls, cor, cnt = rows[rank]
    fp32 = float(sum(torch.tensor(r[0], dtype=torch.float32) for r in rows))
    return {"local": {"loss": ls / cnt, "accuracy": cor / cnt},
            "means": {"loss": sum(r[0] / r[2] for r in rows) / len(rows),
                      "accuracy": sum(r[1] / r[2] for r in rows) / len(rows)},
            "float32": {"loss": fp32 / total, "accuracy": sum(r[1] for r in rows) / total},
            "count": {"loss": sum(r[0] for r in rows) / cnt, "accuracy": sum(r[1] for r in rows) / cnt}}
