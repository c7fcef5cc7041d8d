# Exercise version: generated from ../ddp_train.py by `make student` -- edit this copy.
# The parts marked TODO raise NotImplementedError until you write them; `dlo check --list` shows their checkers.
"""Jour 2 -- data-parallel training of a CIFAR-10 ResNet-18 with DistributedDataParallel (DDP).

Every process (one per GPU, or a few per CPU) holds a full copy of the model and trains it on its own
slice of each global batch. During ``loss.backward()`` DDP averages the gradients of all processes, bucket
by bucket, while the rest of the backward pass is still running; after that every copy takes the same
optimizer step, so the copies stay identical without ever sending weights.

Run it:
    python ddp_train.py --epochs 1                       # one process, no process group
    torchrun --nproc_per_node 2 ddp_train.py --epochs 1  # two processes (gloo on CPU, nccl on GPUs)
    dlo.runtime.launch("ddp_train.py", [...], nproc=2)       # what the notebook does (srun under Slurm)

Exercises 1-6 below are yours: in ``student/ddp_train.py`` their bodies raise NotImplementedError
until you write them, and ``dlo check ddp <step>`` checks one function (``dlo check --list`` shows them).
"""
from __future__ import annotations

import argparse
from typing import NoReturn

from dlo.runtime.arguments import ScriptParser, at_least, parse_for_launch, positive_number
from dlo.runtime.context import dist_context
from dlo.runtime.validate import check_batch_divisible

MODELS = ("resnet18", "heads", "stochdepth")


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="ddp_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--width", type=at_least(1), default=64, help="channels of the first stage (64: the real ResNet-18)")
    p.add_argument("--global-batch", type=at_least(1), default=256, help="images per optimizer step, over all ranks")
    p.add_argument("--epochs", type=at_least(1), default=1)
    p.add_argument("--max-steps", type=at_least(1), default=None, help="stop each epoch after this many steps")
    p.add_argument("--warmup-steps", type=at_least(0), default=2, help="first steps left out of the timing")
    p.add_argument("--lr", type=positive_number, default=0.1)
    p.add_argument("--n-train", type=at_least(1), default=10000, help="generated data only: training images")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--workers", type=at_least(0), default=0, help="DataLoader workers per rank")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--sync-bn", action="store_true")
    p.add_argument("--bucket-cap-mb", type=positive_number, default=25.0)
    p.add_argument("--find-unused-parameters", action="store_true")
    p.add_argument("--comm-view", action="store_true", help="record every gradient bucket's all-reduce")
    p.add_argument("--checkpoint", default=None, help="file to save at the end (rank 0)")
    p.add_argument("--runs", default=None,
                   help='JSON list of runs, each a dict of overrides, e.g. [{"name": "1 MB", "bucket_cap_mb": 1}]: '
                        "several configurations in one launch (the process start-up is paid once)")
    return p


def check_run(args: argparse.Namespace, world_size: int) -> None:
    """The options of one run checked together, and against the launch's process count: a ValueError in one line
    (a --runs entry's values get the same checks as the command line's)."""
    parser = build_parser()
    for action in parser._actions:  # the values a --runs entry overrides, held to the command line's rules
        value = getattr(args, action.dest, None)
        if action.type is not None and value is not None and not isinstance(value, str):
            try:
                action.type(str(value))
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"argument {action.option_strings[0]}: {exc}") from None
    try:
        check_batch_divisible(args.global_batch, world_size)
    except ValueError as exc:
        raise ValueError(f"argument --global-batch: {exc}") from None
    if args.max_steps is not None and args.epochs * args.max_steps <= args.warmup_steps:
        raise ValueError(f"argument --warmup-steps: {args.warmup_steps} warm-up steps leave none of the "
                         f"{args.epochs} x {args.max_steps} steps to time: lower it or run more steps")


def refuse(exc: ValueError) -> NoReturn:
    """The one line, exit code 2. Every rank finds the same mistake and says it: a launcher stops the other ranks at
    the first that fails, so a line left to rank 0 could be lost."""
    build_parser().refuse(exc)


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    parse_for_launch(build_parser(), check_run)

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler
from tqdm.auto import tqdm

import dlo  # noqa: F401  (project caches and the torchvision shim: before any torchvision import)
from dlo import data
from dlo.runtime import synchronize
from dlo.models import ConditionalHeadsNet, StochasticDepthNet
from dlo.parallel.ddp import attach_comm_recorder
from dlo.runtime.validate import per_rank_batch
from dlo.runtime import expand_runs, init_distributed, teardown, write_record
from dlo.models import count_parameters, resnet18_cifar
from dlo.training import save_checkpoint


# ---------------------------------------------------------------------------------------------------
# Exercise 1 -- one device per process
# ---------------------------------------------------------------------------------------------------
def rank_device(ctx) -> torch.device:
    """The device this process trains on: GPU number ``ctx.local_rank`` when there are GPUs, else the CPU.

    ``local_rank`` numbers the processes *of one node* (0..GPUs per node - 1); ``rank`` is global and
    would point past the last GPU on the second node.
    """
    # TODO: Choose the device of this process: one GPU per process on a node, the CPU when there is no GPU.
    # (run `dlo hint ddp device` for a hint)
    raise NotImplementedError('Choose the device of this process: one GPU per process on a node, the CPU when there is no GPU. Run `dlo hint ddp device` for a hint.')


# ---------------------------------------------------------------------------------------------------
# Exercise 2 -- wrap the model
# ---------------------------------------------------------------------------------------------------
def wrap_model(model: nn.Module, ctx, device: torch.device, *, sync_bn: bool = False, bucket_cap_mb: float = 25.0,
               find_unused_parameters: bool = False) -> nn.Module:
    """The model on ``device``, ready for data-parallel training.

    * ``sync_bn``: BatchNorm computes its statistics over the global batch instead of each process's slice
      (one extra all-reduce per BN layer); the wrapper must see the converted layers.
    * The wrapper must know the model's GPU when there is one; on the CPU there is none to give.
    * ``bucket_cap_mb`` and ``find_unused_parameters`` are DDP's options, chosen by the caller.
    With a single process (``ctx.is_distributed`` is False) there is nothing to synchronise and no process
    group: the plain model is what trains, so the same script runs with plain ``python``.
    """
    # TODO: Prepare the model for data-parallel training: on the right device, wrapped for gradient synchronisation only when there are several processes, with the options you are given.
    # (run `dlo hint ddp wrap` for a hint)
    raise NotImplementedError('Prepare the model for data-parallel training: on the right device, wrapped for gradient synchronisation only when there are several processes, with the options you are given. Run `dlo hint ddp wrap` for a hint.')


# ---------------------------------------------------------------------------------------------------
# Exercise 3 -- each process reads its own shard of the data
# ---------------------------------------------------------------------------------------------------
def make_train_loader(dataset, ctx, global_batch: int, *, seed: int = 0, num_workers: int = 0):
    """A DataLoader over this rank's shard of ``dataset``, and the sampler that defines the shard.

    The *global* batch (what the optimizer sees per step) is split evenly between the ranks, and a global
    batch that does not split is refused with a ValueError. The shards must be disjoint and together cover
    the dataset, so every rank must draw the same shuffle (the same seed); they must also have the same
    length, without padding a shard with repeated images. Returns ``(loader, sampler)``.
    """
    # TODO: Give each rank its own, disjoint part of the dataset, with the global batch split evenly between ranks.
    # (run `dlo hint ddp shard` for a hint)
    raise NotImplementedError('Give each rank its own, disjoint part of the dataset, with the global batch split evenly between ranks. Run `dlo hint ddp shard` for a hint.')


# ---------------------------------------------------------------------------------------------------
# Exercise 4 -- one epoch
# ---------------------------------------------------------------------------------------------------
def train_epoch(model, loader, sampler, epoch: int, optimizer, criterion, device, *, max_steps: int | None = None,
                forward=None, step_times: list | None = None, show_bar: bool = True):
    """Train for one epoch; returns this rank's ``(loss_sum, correct, count)`` as tensors.

    ``forward(model, images, step)`` replaces ``model(images)`` when given (e.g. to pick a head).
    ``step_times`` (a list) receives each step's synchronised duration in seconds.
    """
    # TODO: Give each epoch its own shuffle, identical on every rank.
    # (run `dlo hint ddp epoch` for a hint)
    raise NotImplementedError('Give each epoch its own shuffle, identical on every rank. Run `dlo hint ddp epoch` for a hint.')
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    count = torch.zeros((), dtype=torch.int64, device=device)
    total = len(loader) if max_steps is None else min(len(loader), max_steps)
    for step, (images, labels) in enumerate(tqdm(loader, total=total, desc=f"epoch {epoch}", disable=not show_bar,
                                                 leave=False)):
        if step >= total:
            break
        start = time.perf_counter()
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = forward(model, images, step) if forward is not None else model(images)
        loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # under DDP, the gradients are averaged over the ranks during this call
        optimizer.step()
        if step_times is not None:
            synchronize(device)
            step_times.append(time.perf_counter() - start)
        loss_sum += loss.detach().double() * labels.numel()
        correct += (logits.argmax(dim=1) == labels).sum()
        count += labels.numel()
    return loss_sum, correct, count


# ---------------------------------------------------------------------------------------------------
# Exercise 5 -- metrics of the whole run, not of one rank
# ---------------------------------------------------------------------------------------------------
def reduce_metrics(loss_sum: torch.Tensor, correct: torch.Tensor, count: torch.Tensor) -> dict[str, float]:
    """Mean loss and accuracy over *all* ranks' images, identical on every rank.

    Averaging each rank's accuracy would be wrong when shards differ in size: the totals are what add up
    over the ranks. One collective for the three numbers costs less than three. Without a process group
    (one process) the local numbers are the global ones.
    """
    # TODO: Turn each rank's sums (loss, correct answers, images) into global mean loss and accuracy, the same on every rank.
    # (run `dlo hint ddp reduce` for a hint)
    raise NotImplementedError("Turn each rank's sums (loss, correct answers, images) into global mean loss and accuracy, the same on every rank. Run `dlo hint ddp reduce` for a hint.")


# ---------------------------------------------------------------------------------------------------
# Exercise 6 -- one writer
# ---------------------------------------------------------------------------------------------------
def save_on_main(ctx, path, model, optimizer, epoch: int) -> Path | None:
    """Save a checkpoint from rank 0 only, then make every rank wait until it is written.

    All ranks hold the same weights, so N writers would only race on one file. ``dlo.training.save_checkpoint``
    unwraps DDP (no ``module.`` prefix in the keys, so the file loads into a plain model) and writes
    atomically. The barrier stops other ranks from reading (or deleting) the file before it exists.
    Returns the path on rank 0, None elsewhere.
    """
    # TODO: Save a checkpoint from one process only, loadable into a plain model, and make every process wait until it is written.
    # (run `dlo hint ddp checkpoint` for a hint)
    raise NotImplementedError('Save a checkpoint from one process only, loadable into a plain model, and make every process wait until it is written. Run `dlo hint ddp checkpoint` for a hint.')


# ---------------------------------------------------------------------------------------------------
# The run itself (not an exercise)
# ---------------------------------------------------------------------------------------------------
def build_model(name: str, width: int) -> nn.Module:
    if name == "resnet18":
        return resnet18_cifar(width=width)
    if name == "heads":
        return ConditionalHeadsNet(num_classes=10, width=width)
    if name == "stochdepth":
        return StochasticDepthNet(num_classes=10, width=width)
    raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")


def _forward_for(name: str):
    if name == "heads":  # a multi-task-like model: even steps use head 0, odd steps head 1
        return lambda model, images, step: model(images, head=step % 2)
    return None


def run(args: argparse.Namespace, ctx, device: torch.device, dataset, name: str = "run") -> dict:
    say = print if ctx.is_main else (lambda *a, **k: None)
    if args.sync_bn and device.type != "cuda" and ctx.is_distributed:
        raise ValueError(f"[{name}] SyncBatchNorm runs on GPUs only (PyTorch has no CPU version): drop --sync-bn here")
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's at wrap time)
    model = build_model(args.model, args.width)
    model = wrap_model(model, ctx, device, sync_bn=args.sync_bn, bucket_cap_mb=args.bucket_cap_mb,
                       find_unused_parameters=args.find_unused_parameters)
    recorder = attach_comm_recorder(model) if args.comm_view and ctx.is_distributed else None
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    loader, sampler = make_train_loader(dataset, ctx, args.global_batch, seed=args.seed, num_workers=args.workers)
    forward = _forward_for(args.model)
    say(f"[{name}] {args.model} width {args.width}: {count_parameters(model) / 1e6:.2f} M parameters, "
        f"{ctx.world_size} process(es) x {args.global_batch // ctx.world_size} images = global batch "
        f"{args.global_batch}, {len(loader)} steps/epoch")
    step_times: list[float] = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        # A progress bar only in a terminal: under a launcher the output is a pipe, where bars become noise.
        sums = train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, max_steps=args.max_steps,
                           forward=forward, step_times=step_times, show_bar=ctx.is_main and sys.stdout.isatty())
        metrics = reduce_metrics(*sums)
        elapsed = time.perf_counter() - start
        say(f"[{name}] epoch {epoch}: loss {metrics['loss']:.3f}  accuracy {metrics['accuracy']:.3f}  "
            f"({metrics['samples']} images in {elapsed:.1f} s)")
        if ctx.is_main:
            write_record({"kind": "epoch", "run": name, "epoch": epoch, "seconds": elapsed, **metrics})
    timed = step_times[args.warmup_steps:]
    if not timed:
        raise ValueError(f"only {len(step_times)} steps ran, all warm-up (--warmup-steps {args.warmup_steps}): "
                         "run more steps (--max-steps, --epochs) or lower --warmup-steps")
    median = statistics.median(timed)
    record = {"kind": "timing", "run": name, "model": args.model, "width": args.width,
              "global_batch": args.global_batch, "per_rank_batch": args.global_batch // ctx.world_size,
              "sync_bn": args.sync_bn, "bucket_cap_mb": args.bucket_cap_mb, "device": str(device),
              "steps_timed": len(timed), "median_step_s": median, "step_times_s": timed,
              "throughput": args.global_batch / median}
    if recorder is not None:
        record["comm"] = recorder.records
    write_record(record)  # every rank: the notebook compares them
    say(f"[{name}] median step {median * 1e3:.1f} ms -> {args.global_batch / median:.0f} img/s (all ranks)")
    if args.checkpoint:
        save_on_main(ctx, args.checkpoint, model, optimizer, args.epochs)
    return record


def main(argv=None) -> None:
    args = parse_args(argv)
    launch = dist_context()  # every run checked before any process group or data
    try:
        runs = expand_runs(args, args.runs)  # several configurations, one launch
        for _, run_args in runs:
            check_run(run_args, launch.world_size)
    except ValueError as exc:
        refuse(exc)
    ctx = init_distributed()  # dlo.runtime: torchrun or srun variables; nccl on GPUs, gloo on CPU
    device = rank_device(ctx)
    say = print if ctx.is_main else (lambda *a, **k: None)
    say(f"{ctx.world_size} process(es) ({ctx.source}), rank 0 on {device}, backend "
        f"{dist.get_backend() if ctx.is_distributed else 'none'}")
    # Rank 0 prepares the data first (generates it on first use); the others wait, then just read it.
    if ctx.is_main:
        dataset = data.cifar10("train", args.data_dir, data.train_transform(), n_train=args.n_train)
    if ctx.is_distributed:
        dist.barrier()
    if not ctx.is_main:
        dataset = data.cifar10("train", args.data_dir, data.train_transform(), n_train=args.n_train, verbose=False)
    try:
        for name, run_args in runs:
            run(run_args, ctx, device, dataset, name)
    finally:
        teardown()


if __name__ == "__main__":
    main()
