"""Checkers of Jour2/ddp_train.py (``dlo check ddp <step>``): the script's functions, called on small inputs.

Most run in this process: a "distributed" context is faked with a :class:`~dlo.runtime.distributed.DistContext` (rank,
world size) and, where DDP itself is needed, a one-process gloo group. The ``reduce`` step needs real
peers: it starts 2 processes with :func:`dlo.runtime.launch.launch` and each calls the student's function.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

from dlo.course.checks.framework import CheckFailed, expect, register, peer_records
from dlo.runtime.distributed import DistContext

SCRIPT = "Jour2/ddp_train.py"
WORKER = Path(__file__).with_name("ddp_worker.py")


def fake_context(rank: int = 0, world_size: int = 1, local_rank: int | None = None) -> DistContext:
    """A DistContext as torchrun would describe process ``rank`` of ``world_size`` (4 per node)."""
    local = rank % 4 if local_rank is None else local_rank
    return DistContext(rank=rank, local_rank=local, world_size=world_size, local_world_size=min(world_size, 4),
                       master_addr="127.0.0.1", master_port=29500, source="torchrun" if world_size > 1 else "single")


@contextlib.contextmanager
def one_process_group():
    """A gloo process group of world size 1 in this process (enough to build a DDP wrapper)."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


class _BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


@register("ddp", "device", ("rank_device",), SCRIPT)
def _check_device(rank_device: Callable) -> str:
    ctx = fake_context(rank=5, world_size=8)  # second node, local rank 1
    with mock.patch("torch.cuda.is_available", return_value=False):
        dev = rank_device(ctx)
    expect(isinstance(dev, torch.device) and dev.type == "cpu", f"without GPUs return torch.device('cpu'), got {dev!r}")
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.device_count", return_value=4):
        dev = rank_device(ctx)
    expect(isinstance(dev, torch.device) and dev.type == "cuda",
            f"with GPUs return a CUDA device, got {dev!r}")
    expect(dev.index == ctx.local_rank,
            f"rank 5 of 8 (4 GPUs per node) must use cuda:{ctx.local_rank} (its local_rank), got {dev}: "
            "the global rank points past the node's last GPU")
    # two processes per node on nodes of 4 GPUs: rank 3 is the second process of the second node, so a device
    # derived from the global rank (rank % GPUs = 3) differs from local_rank (1)
    ctx = DistContext(rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="127.0.0.1",
                      master_port=29500, source="torchrun")
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.device_count", return_value=4):
        dev = rank_device(ctx)
    expect(isinstance(dev, torch.device) and dev.index == ctx.local_rank,
           f"with 2 processes on each node of 4 GPUs, rank 3 must use cuda:1 (its local_rank), got {dev}: a device "
           "computed from the global rank (e.g. rank % device_count) is right only when every node runs one process "
           "per GPU")
    return "one GPU per process, chosen by local_rank; CPU otherwise"


_DDP_ERRORS = (  # what torch says when DDP is built the wrong way, and what it means here
    ("process group has not been initialized",
     "with one process (ctx.is_distributed False) return the model unwrapped: DDP needs a process group"),
    ("device_ids", "on the CPU there is no GPU to give DDP: device_ids is only for a model on one GPU per process"),
    ("SyncBatchNorm", "keep plain BatchNorm unless sync_bn=True (and SyncBatchNorm needs GPUs)"),
)


def _explain_ddp_errors(fn: Callable) -> Callable:
    """``fn`` with torch's ValueError/RuntimeError on a wrongly built DDP turned into a CheckFailed that says why."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except (ValueError, RuntimeError) as exc:
            for needle, why in _DDP_ERRORS:
                if needle in str(exc):
                    raise CheckFailed(f"{why} (torch said: {str(exc).splitlines()[0][:160]})") from None
            raise
    return call


@register("ddp", "wrap", ("wrap_model",), SCRIPT)
def _check_wrap(wrap_model: Callable) -> str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrap_model = _explain_ddp_errors(wrap_model)

    cpu = torch.device("cpu")
    single = wrap_model(_BNNet(), fake_context(), cpu)
    expect(not isinstance(single, DDP), "with one process (ctx.is_distributed False) return the model, unwrapped")
    synced = wrap_model(_BNNet(), fake_context(), cpu, sync_bn=True)
    expect(any(isinstance(m, nn.SyncBatchNorm) for m in synced.modules()),
            "sync_bn=True but the model still has plain BatchNorm layers: they must become SyncBatchNorm (before "
            "wrapping)")
    with one_process_group():
        wrapped = wrap_model(_BNNet(), fake_context(0, 2), cpu, bucket_cap_mb=1.0, find_unused_parameters=True)
        expect(isinstance(wrapped, DDP), "with several processes wrap the model in DistributedDataParallel")
        expect(wrapped.device_ids is None, "DDP was given device_ids for a CPU model: device_ids is only for a model on "
                                           "one GPU per process")
        expect(wrapped.find_unused_parameters, "pass find_unused_parameters on to DDP")
        expect(wrapped.bucket_bytes_cap == 1024 * 1024, "pass bucket_cap_mb on to DDP")
        plain = wrap_model(_BNNet(), fake_context(0, 2), cpu)
        expect(not any(isinstance(m, nn.SyncBatchNorm) for m in plain.modules()),
                "keep plain BatchNorm unless sync_bn=True (SyncBatchNorm costs one all-reduce per layer)")
        # (DDP refuses SyncBatchNorm on CPU modules, so sync_bn=True under DDP cannot be built here)
    return "DDP when distributed, SyncBatchNorm on request, options passed on"


@register("ddp", "shard", ("make_train_loader",), SCRIPT)
def _check_shard(make_train_loader: Callable) -> str:
    dataset = TensorDataset(torch.arange(40))
    seen: list[list[int]] = []
    for rank in (0, 1):
        loader, sampler = make_train_loader(dataset, fake_context(rank, 2), 8, seed=3)
        expect(isinstance(sampler, DistributedSampler), "return a torch.utils.data.DistributedSampler as the sampler")
        expect(sampler.num_replicas == 2 and sampler.rank == rank,
                "give the sampler num_replicas=ctx.world_size and rank=ctx.rank (the process group may not exist yet)")
        expect(loader.sampler is sampler, "the loader does not draw from the sampler you return (its sampler= is another "
                                          "one): the shard is never used")
        expect(loader.batch_size == 4, f"each of 2 ranks loads global_batch / world_size = 4 images, got {loader.batch_size}")
        seen.append([int(i) for (batch,) in loader for i in batch])
    expect(not set(seen[0]) & set(seen[1]), "the two ranks' shards overlap: use the same seed on every rank")
    expect(sorted(seen[0] + seen[1]) == list(range(40)), "together the shards must cover the dataset once per epoch")
    expect(seen[0] != sorted(seen[0]), "shuffle=True: the order should be random")
    # the seed argument decides the shuffle (the same on every rank, a different one for another seed)
    orders = {}
    for seed in (3, 4):
        loader, _ = make_train_loader(dataset, fake_context(0, 2), 8, seed=seed)
        orders[seed] = [int(i) for (batch,) in loader for i in batch]
    expect(orders[3] != orders[4], "seeds 3 and 4 gave the same shuffle: the sampler must use the seed argument")
    # 41 images on 2 ranks: equal shards without repeating an image (a padded sampler repeats one)
    odd = TensorDataset(torch.arange(41))
    shards = [[int(i) for (batch,) in make_train_loader(odd, fake_context(rank, 2), 2, seed=1)[0] for i in batch]
              for rank in (0, 1)]
    both = shards[0] + shards[1]
    expect(len(both) == len(set(both)),
           f"41 images on 2 ranks: an image appears on both ranks ({sorted(set(i for i in both if both.count(i) > 1))})"
           ": the sampler padded the shards with repeated images; drop the uneven tail instead")
    expect(len(shards[0]) == len(shards[1]), f"41 images on 2 ranks: shards of {len(shards[0])} and {len(shards[1])} "
                                             "images: every rank must take the same number of steps")
    try:
        make_train_loader(dataset, fake_context(0, 2), 9)
    except ValueError:
        pass
    else:
        raise CheckFailed("a global batch of 9 on 2 ranks was accepted: it does not split evenly, so it must raise "
                          "ValueError before any work (dlo.parallel.ddp.per_rank_batch does)")
    return "disjoint shards covering the data, per-rank batch = global / world size"


class _RecordingSampler(DistributedSampler):
    def __init__(self, dataset) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
        self.calls: list[int] = []

        self.drawn_with: list[int] = []  # the epoch each shuffle was drawn with

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)
        super().set_epoch(epoch)

    def __iter__(self):
        self.drawn_with.append(self.epoch)
        return super().__iter__()


@register("ddp", "epoch", ("train_epoch",), SCRIPT)
def _check_epoch(train_epoch: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g))
    sampler = _RecordingSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_epoch(model, loader, sampler, 3, opt, nn.CrossEntropyLoss(), torch.device("cpu"), show_bar=False)
    calls = sampler.calls
    expect(bool(calls), "the sampler was never told the epoch: every epoch repeats epoch 0's shuffle")
    expect(len(calls) == 1, f"the sampler was told the epoch {len(calls)} times (calls seen: {calls}): once per epoch, "
                            "at its start, is enough")
    expect(calls == [3], f"during epoch 3 the sampler was told epoch {calls[0]}: the shuffle must come from this "
                         "epoch's own number (the same on every rank, another one next epoch)")
    expect(sampler.drawn_with == [3],
           f"this epoch's order was drawn with epoch {sampler.drawn_with[0] if sampler.drawn_with else None}: "
           "set_epoch came after the loader started iterating, and the shuffle is fixed when iteration begins, so "
           "the epoch must be set before; two epochs share one order")
    expect(int(out[2]) == 12, "the epoch must still go through every batch")
    return "set_epoch(epoch) gives each epoch its own shuffle, identical on all ranks"


def _run_ranks(fn: Callable, nproc: int, *extra: str) -> list[dict]:
    """Each of ``nproc`` gloo processes imports the script defining ``fn`` and calls it (see ddp_worker.py)."""
    name = fn.__name__
    script = Path(fn.__code__.co_filename)
    expect(script.suffix == ".py" and script.is_file(),
           f"{name} must be defined in a script file (ddp_train.py) so that {nproc} processes can import it")
    records = peer_records(WORKER, [str(script), name, *extra], nproc)
    errors = [r["error"] for r in records if "error" in r]
    if any(e.startswith("NotImplementedError") for e in errors):
        raise NotImplementedError(errors[0].split(":", 1)[-1].strip())
    expect(not errors, f"{name} raised on {nproc} processes: {errors[0] if errors else ''}")
    return sorted(records, key=lambda r: r["rank"])


@register("ddp", "reduce", ("reduce_metrics",), SCRIPT)
def _check_reduce(reduce_metrics: Callable) -> str:
    if not dist.is_initialized():  # one process: the local numbers are the global ones
        got = reduce_metrics(torch.tensor(5.0, dtype=torch.float64), torch.tensor(4), torch.tensor(10))
        expect(isinstance(got, dict) and abs(got.get("loss", -1) - 0.5) < 1e-9 and abs(got.get("accuracy", -1) - 0.4) < 1e-9,
                f"one process (no process group): expected loss 0.5, accuracy 0.4, got {got!r}")
    records = _run_ranks(reduce_metrics, 2)
    # rank 0: loss sum 5.1 over 10 images, 4 right; rank 1: loss sum 40.3 over 30 images, 27 right
    local = {0: (5.1 / 10, 4 / 10), 1: (40.3 / 30, 27 / 30)}
    in_fp32 = float(torch.tensor(5.1) + torch.tensor(40.3)) / 40
    for r in records:
        got = r["result"]
        expect(not all(abs(got.get(k, -1) - v) < 1e-9 for k, v in zip(("loss", "accuracy"), local[r["rank"]])),
               f"rank {r['rank']} returned its own shard's numbers (loss {got.get('loss')}): the sums over the ranks "
               "never reached what you return (a reduction into a copy that is not read back?)")
        expect(not (abs(got.get("loss", -1) - in_fp32) < 1e-9 and abs(in_fp32 - 45.4 / 40) > 1e-9),
               f"rank {r['rank']}: the loss {got.get('loss')!r} lost digits: the totals were summed in float32 (24 "
               f"bits), expected {45.4 / 40!r}; over a real epoch's millions of images that error grows; keep the "
               "totals in float64")
        expect(abs(got.get("loss", -1) - 45.4 / 40) < 1e-9,
               f"rank {r['rank']}: global loss is (5.1 + 40.3) / (10 + 30) = 1.135, got {got.get('loss')} "
               "(averaging the ranks' means is wrong when shards differ in size)")
        expect(abs(got.get("accuracy", -1) - 31 / 40) < 1e-9,
               f"rank {r['rank']}: global accuracy is (4 + 27) / 40 = 0.775, got {got.get('accuracy')}")
    return "sums all-reduced over the ranks, then divided: the same global numbers on every rank"


@register("ddp", "checkpoint", ("save_on_main",), SCRIPT)
def _check_checkpoint(save_on_main: Callable) -> str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        model = _BNNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = save_on_main(fake_context(1, 2), path, model, opt, 1)
        expect(not path.exists() and out is None, "rank 1 must not write the checkpoint (only rank 0 does)")
        with one_process_group():
            wrapped = DDP(model)
            out = save_on_main(fake_context(0, 1), path, wrapped, opt, 1)
        expect(path.is_file(), "rank 0 must write the checkpoint at `path`")
        try:  # a checkpoint holds tensors and plain values: loaded safely, as the course loads every file
            state: Any = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file is the student's mistake, said in one line
            raise CheckFailed(f"the checkpoint at `path` does not load with torch.load(weights_only=True) "
                              f"({type(exc).__name__}): save tensors and plain values, e.g. with "
                              "dlo.training.checkpoint.save_checkpoint") from None
        weights = state.get("model", state) if isinstance(state, dict) else None
        expect(isinstance(weights, dict) and not any(k.startswith("module.") for k in weights),
                "save the unwrapped model (keys without 'module.'): use dlo.training.checkpoint.save_checkpoint, which unwraps DDP")
        fresh = _BNNet()
        fresh.load_state_dict(weights)
    # Real processes: a barrier (or a save) on some ranks only passes in one process but hangs a real run.
    with tempfile.TemporaryDirectory() as tmp:
        records = _run_ranks(save_on_main, 3, tmp)
    calls = [r["result"]["barriers"] for r in records]
    waited = [rank for rank, c in enumerate(calls) if c]
    expect(len(waited) == 3,
           f"on 3 processes only rank(s) {waited or 'none'} called dist.barrier(): every rank must call it "
           "(a barrier on rank 0 only hangs; no barrier lets ranks 1-2 read the file before it exists)")
    expect(len({len(c) for c in calls}) == 1,
           f"the ranks called dist.barrier() {[len(c) for c in calls]} times: the same number on every rank, "
           "else the extra ones wait forever")
    expect(calls[0][0], "rank 0 reached the barrier before the checkpoint existed: save first, then dist.barrier()")
    expect(records[0]["result"]["returned"] is not None and all(r["result"]["returned"] is None for r in records[1:]),
           "return the path on rank 0 and None on the other ranks")
    return "rank 0 writes a checkpoint that loads into a plain model; every rank waits at the barrier (3 processes)"
