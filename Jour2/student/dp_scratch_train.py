# Exercise version: generated from ../dp_scratch_train.py by `make student` -- edit this copy.
# The parts marked TODO raise NotImplementedError until you write them; `dlo check --list` shows their checkers.
"""Jour 2 -- data parallelism under the hood: DistributedDataParallel written by hand, in five steps.

Every process holds a full copy of the model and computes the gradients of its own slice of the global
batch. For the copies to stay identical, two things are needed: they must *start* identical, and after
each backward every process must hold the *average* of all processes' gradients. DDP does both; here you
write them yourself, from the simplest version to the one DDP really uses:

1. ``allreduce_gradients``: every rank ends up with the average gradient, after backward;
2. ``broadcast_state``: every rank starts from rank 0's weights and buffers;
3. ``OverlappedGradSync``: the averaging of a gradient starts as soon as that gradient exists, so that
   communication runs *while backward continues* on the earlier layers;
4. ``plan_buckets`` + ``BucketedGradSync``: the same, with fewer and larger messages (gradients grouped
   into buckets);
5. ``GradSync.no_sync`` + ``train_step_accumulated``: gradient accumulation over k micro-batches that
   communicates once per optimizer step, not once per micro-batch.

Run it:
    torchrun --nproc_per_node 2 dp_scratch_train.py              # times every version against DDP
    dlo.runtime.launch("dp_scratch_train.py", [...], nproc=2)    # what the notebook does (srun under Slurm)

In ``student/dp_scratch_train.py`` the parts marked TODO raise NotImplementedError until you write them;
``dlo check dp_scratch <step>`` checks one step (``dlo check --list`` shows them).
"""
from __future__ import annotations

import argparse

from dlo.runtime.arguments import ScriptParser, at_least, comma_list_among, positive_number
from dlo.runtime.context import dist_context

#: The hand-written versions a launch may time (``--versions``); DDP and the compute-only step are always timed.
VERSIONS = ("naive", "overlap", "buckets", "accumulate")


def comma_list(item):
    """``type=`` of an option holding a comma-separated list, each value parsed (and checked) by ``item``."""

    def parse(text: str) -> list:
        values = [item(v) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"give at least one value, got {text!r}")
        return values

    return parse


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="dp_scratch_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=comma_list(at_least(1)), default=[512, 512, 512, 512],
                   help="hidden widths of the MLP, e.g. 512,512")
    p.add_argument("--image-size", type=at_least(1), default=32, help="random images of 3 x SIZE x SIZE (the MLP's input)")
    p.add_argument("--per-rank-batch", type=at_least(1), default=32)
    p.add_argument("--bucket-mb", type=comma_list(positive_number), default=[0.25, 1.0, 4.0, 25.0],
                   help="bucket sizes to time (MiB)")
    p.add_argument("--accum", type=at_least(1), default=4, help="micro-batches per step in the accumulation runs")
    p.add_argument("--accum-bucket-mb", type=positive_number, default=1.0)
    p.add_argument("--repeats", type=at_least(1), default=7)
    p.add_argument("--warmup-max-calls", type=at_least(1), default=12, help="cap on the warm-up calls of each configuration")
    p.add_argument("--gantt-steps", type=at_least(1), default=3, help="steps run with the event recorder (the last is kept)")
    p.add_argument("--gantt-bucket-mb", type=positive_number, default=1.0)
    p.add_argument("--drift-steps", type=at_least(1), default=3)
    p.add_argument("--lr", type=positive_number, default=0.01)
    p.add_argument("--versions", type=comma_list_among(VERSIONS, "version"), default=list(VERSIONS),
                   help="the hand-written versions to time, e.g. naive,overlap (a launch right after those steps)")
    return p


def parse_args(argv=None, world_size: int | None = None) -> argparse.Namespace:
    """The options; with ``world_size`` (the launch's), also refuse a launch of one process: data parallelism needs
    several (one line and exit code 2 on every rank)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if world_size is not None and world_size < 2:
        parser.refuse(ValueError("this script compares data-parallel versions: run it on several processes "
                                 "(torchrun --nproc_per_node 2 dp_scratch_train.py)"))
    return args


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    parse_args(world_size=dist_context().world_size)

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import dlo  # noqa: F401  (project caches and the torchvision shim: before any torchvision import)
from dlo.measure import bench
from dlo.models import MLP, count_parameters
from dlo.parallel.dp_events import Timeline, agreed_timer, record_collectives
from dlo.runtime import exit_after_success, init_distributed, teardown, write_record


# ---------------------------------------------------------------------------------------------------
# Given: one device per process
# ---------------------------------------------------------------------------------------------------
def rank_device(ctx) -> torch.device:
    """GPU number ``local_rank`` on a GPU node (NCCL), the CPU otherwise (gloo). See ddp_train.py, exercise 1."""
    if torch.cuda.is_available():
        return torch.device("cuda", ctx.local_rank)
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------------
# Step 1 -- naive: all-reduce every gradient after backward
# ---------------------------------------------------------------------------------------------------
def allreduce_gradients(model: nn.Module) -> None:
    """Called after ``loss.backward()``: afterwards every ``p.grad`` the optimizer will read holds the mean of
    that gradient over all ranks, the same on every rank.

    Why the mean: each rank's loss is a mean over its own slice of the global batch, so the mean of the ranks'
    gradients is the gradient of the mean loss over the whole global batch, what one process would compute
    on it. A parameter that is frozen (``requires_grad=False``) has no gradient and needs none.
    """
    # TODO: After the backward pass, make every rank's gradients the average of all ranks' gradients, so that one optimizer step equals a step on the whole global batch.
    # (run `dlo hint dp_scratch naive` for a hint)
    raise NotImplementedError("After the backward pass, make every rank's gradients the average of all ranks' gradients, so that one optimizer step equals a step on the whole global batch. Run `dlo hint dp_scratch naive` for a hint.")


# ---------------------------------------------------------------------------------------------------
# Step 2 -- identical copies: rank 0's weights and buffers everywhere
# ---------------------------------------------------------------------------------------------------
def broadcast_state(model: nn.Module) -> None:
    """Copy rank 0's parameters *and buffers* (e.g. BatchNorm's running statistics) into every rank's model,
    in place, as ``DistributedDataParallel(model)`` does when it is built.

    Why: averaged gradients keep identical copies identical; they do nothing for copies that started apart
    (a different seed, a checkpoint loaded on one rank only): every rank would apply the same update to its
    own weights forever. A broadcast is a collective: every rank takes part, and whatever is received must
    end up in the model's own tensors (frozen parameters and integer buffers included) before this returns.
    """
    # TODO: Before training, make every rank's model an exact copy of rank 0's: its weights and its other state.
    # (run `dlo hint dp_scratch broadcast` for a hint)
    raise NotImplementedError("Before training, make every rank's model an exact copy of rank 0's: its weights and its other state. Run `dlo hint dp_scratch broadcast` for a hint.")


# ---------------------------------------------------------------------------------------------------
# What the hand-written versions share
# ---------------------------------------------------------------------------------------------------
class GradSync:
    """Gradient synchronisation of ``model``, in the training step's order::

        loss.backward()     # hooks may launch all-reduces while it runs
        sync.finish()       # returns when every p.grad holds the mean over the ranks
        optimizer.step()

    ``require_sync`` is False inside :meth:`no_sync`: the hooks then launch nothing and the gradients just
    accumulate locally (step 5).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.require_sync = True
        self.hook_handles: list[Any] = []

    def finish(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define finish()")

    def remove(self) -> None:
        """Unregister the hooks (the model trains alone again)."""
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()

    @contextlib.contextmanager
    def no_sync(self):
        """Inside ``with sync.no_sync():`` backward passes communicate nothing, as under DDP's ``model.no_sync()``;
        after the block, however it ends (an exception included), communication is as it was before."""
        # TODO: Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the step equals one step on the k micro-batches together.
        # (run `dlo hint dp_scratch no_sync` for a hint)
        raise NotImplementedError('Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the step equals one step on the k micro-batches together. Run `dlo hint dp_scratch no_sync` for a hint.')


class NaiveGradSync(GradSync):
    """Step 1 as a GradSync: nothing during backward, every gradient all-reduced in :meth:`finish`."""

    def finish(self) -> None:
        allreduce_gradients(self.model)


class LocalOnly(GradSync):
    """No communication at all: the compute-only step that the others are compared with."""

    def finish(self) -> None:
        pass


class DDPSync(GradSync):
    """DistributedDataParallel behind the same interface: it averages during backward, so finish() has
    nothing left to do; ``no_sync()`` is DDP's own (which must cover the forward as well as the backward)."""

    def __init__(self, ddp_model: nn.Module) -> None:
        super().__init__(ddp_model)

    def finish(self) -> None:
        pass

    def no_sync(self):
        return self.model.no_sync()


# ---------------------------------------------------------------------------------------------------
# Step 3 -- overlap: one asynchronous all-reduce per gradient, launched by a hook during backward
# ---------------------------------------------------------------------------------------------------
class OverlappedGradSync(GradSync):
    """Averages each trained parameter's gradient, starting the moment autograd has finished that gradient.

    Why: backward computes the last layers' gradients first. If their averaging starts right away and runs
    in the background while backward goes on with the earlier layers, the communication is hidden behind
    compute; if backward has to stop until each average arrives, nothing is gained over step 1. When
    :meth:`finish` returns, every ``p.grad`` holds its average and nothing is left in flight.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.pending: list[tuple[Any, torch.Tensor]] = []  # (handle, gradient) launched during this backward
        # TODO: Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step.
        # (run `dlo hint dp_scratch overlap` for a hint)
        raise NotImplementedError('Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step. Run `dlo hint dp_scratch overlap` for a hint.')

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        """The hook: autograd calls it with the parameter once ``param.grad`` holds this backward's gradient."""
        if not self.require_sync:  # inside no_sync() (step 5): the gradient only accumulates locally
            return
        # TODO: Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step.
        # (run `dlo hint dp_scratch overlap` for a hint)
        raise NotImplementedError('Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step. Run `dlo hint dp_scratch overlap` for a hint.')

    def finish(self) -> None:
        # TODO: Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step.
        # (run `dlo hint dp_scratch overlap` for a hint)
        raise NotImplementedError('Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, and make sure every average has arrived before the optimizer step. Run `dlo hint dp_scratch overlap` for a hint.')


# ---------------------------------------------------------------------------------------------------
# Step 4 -- buckets: fewer, larger all-reduces
# ---------------------------------------------------------------------------------------------------
def plan_buckets(params: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Which parameters share a bucket: lists of indices into ``params``, the first bucket first.

    The plan DDP makes, so that a bucket fills up as early as possible during backward: gradients are ready
    in roughly the reverse of the registration order (backward starts from the last layer), so the first
    bucket holds the last parameters. DDP's rule: a bucket is closed as soon as its gradients add up to at
    least ``bucket_bytes`` *bytes* (gradients may be fp32, bf16, fp16 or fp64; a parameter larger than that
    gets a bucket of its own); every parameter is in exactly one bucket, the last one possibly smaller. The
    order of the indices inside a bucket is free.
    """
    # TODO: Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients.
    # (run `dlo hint dp_scratch buckets` for a hint)
    raise NotImplementedError('Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients. Run `dlo hint dp_scratch buckets` for a hint.')


class BucketedGradSync(GradSync):
    """Step 3 with fewer, larger messages: a bucket's gradients are averaged together, in one flat buffer, as
    soon as the bucket holds all of them (the last, smaller bucket too), while backward goes on. When
    :meth:`finish` returns, every ``p.grad`` holds its average, nothing is in flight, and the next backward
    starts from empty buckets.

    Given: ``self.params`` (the parameters, registration order), ``self.plan`` (your :func:`plan_buckets`),
    ``self.slot[i]`` = (bucket, offset) of parameter ``i`` in the flat ``self.buffers[bucket]``,
    ``self.index[id(p)]`` = ``i``, and ``self.ready[bucket]``, the number of gradients copied in so far.
    """

    def __init__(self, model: nn.Module, bucket_bytes: int) -> None:
        super().__init__(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.plan = plan_buckets(self.params, bucket_bytes)
        self.slot: dict[int, tuple[int, int]] = {}
        self.buffers: list[torch.Tensor] = []
        for b, members in enumerate(self.plan):
            offset = 0
            for i in members:
                self.slot[i] = (b, offset)
                offset += self.params[i].numel()
            first = self.params[members[0]]
            self.buffers.append(torch.zeros(offset, dtype=first.dtype, device=first.device))
        self.ready = [0 for _ in self.plan]  # gradients copied into each bucket so far
        self.pending: list[tuple[int, Any]] = []  # (bucket, handle) launched during this backward
        # TODO: Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients.
        # (run `dlo hint dp_scratch buckets` for a hint)
        raise NotImplementedError('Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients. Run `dlo hint dp_scratch buckets` for a hint.')

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self.require_sync:  # inside no_sync() (step 5)
            return
        # TODO: Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients.
        # (run `dlo hint dp_scratch buckets` for a hint)
        raise NotImplementedError('Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients. Run `dlo hint dp_scratch buckets` for a hint.')

    def finish(self) -> None:
        # TODO: Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients.
        # (run `dlo hint dp_scratch buckets` for a hint)
        raise NotImplementedError('Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward produces them, and average each bucket as soon as it holds all its gradients. Run `dlo hint dp_scratch buckets` for a hint.')


# ---------------------------------------------------------------------------------------------------
# Step 5 -- gradient accumulation: communicate on the last micro-batch only
# ---------------------------------------------------------------------------------------------------
def train_step_accumulated(model: nn.Module, sync: GradSync, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                           criterion: Callable, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One optimizer step over the k micro-batches given, equal to one step on their concatenation.

    After it, the weights are those one optimizer step on the k micro-batches together would give, the same
    on every rank, and it returns the mean of the k micro-batches' losses (a number or a detached tensor).

    Why: gradients add up in ``p.grad`` over backward passes, so k passes can build the gradient of the mean
    loss; communicating after every micro-batch would cost k all-reduces for the result of one. Under
    ``sync.no_sync()`` nothing is communicated; DDP decides during the *forward* whether the next backward
    communicates. The optimizer must only see averaged gradients, and only this step's.
    """
    # TODO: Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the step equals one step on the k micro-batches together.
    # (run `dlo hint dp_scratch no_sync` for a hint)
    raise NotImplementedError('Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the step equals one step on the k micro-batches together. Run `dlo hint dp_scratch no_sync` for a hint.')


# ---------------------------------------------------------------------------------------------------
# The measurements (not an exercise)
# ---------------------------------------------------------------------------------------------------
def make_model(args, seed: int, device: torch.device) -> nn.Module:
    """The MLP of ``args.hidden`` on flattened 3 x image_size x image_size images (same weights for the same seed)."""
    torch.manual_seed(seed)
    return MLP(in_features=3 * args.image_size ** 2, hidden=tuple(args.hidden), num_classes=10).to(device)


def make_batches(args, n: int, device: torch.device, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random images and labels, generated on each rank with its own seed (each rank has its own slice)."""
    gen = torch.Generator().manual_seed(seed)
    size, batch = args.image_size, args.per_rank_batch
    return [(torch.randn(batch, 3, size, size, generator=gen).to(device),
             torch.randint(0, 10, (batch,), generator=gen).to(device)) for _ in range(n)]


def train_step(model: nn.Module, sync: GradSync, batch, criterion, optimizer, timeline: Timeline | None = None) -> None:
    """forward, backward (hooks may communicate), finish (wait for / run the all-reduces), optimizer step."""
    span = timeline.span if timeline is not None else (lambda name: contextlib.nullcontext())
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    with span("forward"):
        loss = criterion(model(x), y)
    with span("backward"):
        loss.backward()
    with span("wait"):
        sync.finish()
    with span("optimizer"):
        optimizer.step()


def build(version: str, args, device: torch.device, *, bucket_mb: float | None = None, seed: int = 0):
    """A fresh model (same initial weights on every rank), its optimizer and its GradSync."""
    model = make_model(args, seed, device)
    if version == "DDP":
        cap = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}  # None: DDP's default (25 MiB)
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **cap)
        sync: GradSync = DDPSync(model)
    else:
        broadcast_state(model)  # what DDP does when it is built
        sync = {"compute only": LocalOnly, "naive": NaiveGradSync, "overlap": OverlappedGradSync}.get(version)
        sync = sync(model) if sync is not None else BucketedGradSync(model, int(bucket_mb * 2**20))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, sync, optimizer


def _name(version: str, bucket_mb: float | None) -> str:
    if version == "buckets":
        return f"buckets {bucket_mb:g} MiB"
    if version == "DDP" and bucket_mb is not None:
        return f"DDP bucket_cap_mb={bucket_mb:g}"
    return "DDP (25 MiB default)" if version == "DDP" else version


def drift(args, ctx, device: torch.device) -> dict:
    """Ranks that start from different weights (a seed per rank) and train with averaged gradients: how far
    apart are their weights after a few steps, with and without broadcast_state first?"""
    out = {}
    criterion = nn.CrossEntropyLoss()
    batches = make_batches(args, args.drift_steps, device, seed=1000 + ctx.rank)
    for label, do_broadcast in (("without broadcast", False), ("with broadcast", True)):
        model = make_model(args, seed=ctx.rank, device=device)
        if do_broadcast:
            broadcast_state(model)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        sync = NaiveGradSync(model)
        for batch in batches:
            train_step(model, sync, batch, criterion, opt)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        gap = (flat - reference).abs().max().reshape(1)
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        out[label] = float(gap)
    return out


def gantt_events(version: str, args, ctx, device: torch.device, bucket_mb: float | None) -> list[dict]:
    """Events of this rank over one training step (after warm-up steps), every all-reduce included."""
    model, sync, opt = build(version, args, device, bucket_mb=bucket_mb)
    if version == "DDP":  # DDP's own all-reduces happen in C++; the Python default hook makes them visible
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    criterion = nn.CrossEntropyLoss()
    batches = make_batches(args, args.gantt_steps, device, seed=2000 + ctx.rank)
    timeline = Timeline(device, rank=ctx.rank)
    with record_collectives(timeline):
        for step, batch in enumerate(batches):
            timeline.clear()
            dist.barrier()
            timeline.start(step)
            train_step(model, sync, batch, criterion, opt, timeline)
    if isinstance(sync, GradSync):
        sync.remove()
    return timeline.events


def candidates(args, ctx, device: torch.device) -> list[bench.Candidate]:
    """One training step per configuration, each on its own model and optimizer: DDP, the hand-written
    versions, the compute-only step, the bucket sizes, and accumulation over k micro-batches with no_sync."""
    criterion = nn.CrossEntropyLoss()
    global_batch = args.per_rank_batch * ctx.world_size
    batches = make_batches(args, 4, device, seed=3000 + ctx.rank)
    micro = [make_batches(args, args.accum, device, seed=4000 + 10 * ctx.rank + j) for j in range(2)]
    out = []
    configs = [("compute only", None)] + [(v, None) for v in ("naive", "overlap") if v in args.versions] + [("DDP", None)]
    if "buckets" in args.versions:
        configs += [("buckets", mb) for mb in args.bucket_mb] + [("DDP", mb) for mb in args.bucket_mb if mb != 25]
    for version, mb in configs:
        model, sync, opt = build(version, args, device, bucket_mb=mb)
        calls = itertools.cycle(batches)
        out.append(bench.Candidate(_name(version, mb),
                                   lambda m=model, s=sync, o=opt, c=calls: train_step(m, s, next(c), criterion, o),
                                   global_batch, device, {"version": version, "bucket_mb": mb}))
    accumulated = (("compute only", None), ("buckets", args.accum_bucket_mb), ("DDP", None))
    for version, mb in accumulated if "accumulate" in args.versions else ():
        model, sync, opt = build(version, args, device, bucket_mb=mb)
        calls = itertools.cycle(micro)
        out.append(bench.Candidate(f"accumulate {args.accum}: {_name(version, mb)}",
                                   lambda m=model, s=sync, o=opt, c=calls: train_step_accumulated(m, s, next(c), criterion, o),
                                   global_batch * args.accum, device,
                                   {"version": version, "bucket_mb": mb, "accumulate": args.accum}))
    return out


def main(argv=None) -> None:
    args = parse_args(argv, world_size=dist_context().world_size)  # before any process group
    ctx = init_distributed()  # dlo.runtime: torchrun or srun variables; nccl on GPUs, gloo on CPU
    device = rank_device(ctx)
    say = print if ctx.is_main else (lambda *a, **k: None)
    try:
        probe = make_model(args, 0, device)
        params = [p for p in probe.parameters()]
        say(f"{ctx.world_size} processes ({dist.get_backend()}), rank 0 on {device}; MLP {args.hidden}: "
            f"{count_parameters(probe) / 1e6:.2f} M parameters, {len(params)} tensors, "
            f"{sum(p.numel() * p.element_size() for p in params) / 2**20:.1f} MiB of gradients")
        if ctx.is_main:
            write_record({"kind": "setup", "hidden": args.hidden, "per_rank_batch": args.per_rank_batch,
                          "parameters": count_parameters(probe), "tensors": len(params), "device": str(device),
                          "backend": dist.get_backend(),
                          "grad_bytes": sum(p.numel() * p.element_size() for p in params),
                          "plans": {str(mb): [[int(i) for i in b] for b in plan_buckets(params, int(mb * 2**20))]
                                    for mb in args.bucket_mb} if "buckets" in args.versions else {},
                          "tensor_bytes": [p.numel() * p.element_size() for p in params]})
        gaps = drift(args, ctx, device)
        say(f"largest weight difference between ranks after {args.drift_steps} steps from different seeds: "
            + ", ".join(f"{k} {v:.2g}" for k, v in gaps.items()))
        if ctx.is_main:
            write_record({"kind": "drift", "steps": args.drift_steps, **gaps})

        for version, mb in (("naive", None), ("overlap", None), ("buckets", args.gantt_bucket_mb), ("DDP", None)):
            if version != "DDP" and version not in args.versions:
                continue
            write_record({"kind": "events", "version": _name(version, mb),
                          "events": gantt_events(version, args, ctx, device, mb)})
        say("events recorded for the Gantt charts")

        cands = candidates(args, ctx, device)
        warmup = bench.Warmup(max_calls=args.warmup_max_calls)
        # agreed_timer: every rank gets the slowest rank's time of each call, so that all ranks take the same
        # warm-up decisions (the same number of calls: every call is a collective) and the same numbers.
        measured = bench.measure_interleaved(cands, repeats=args.repeats, warmup=warmup, track_memory=False,
                                             progress=False, timer=agreed_timer(device))
        if ctx.is_main:
            for m in measured.values():
                write_record({"kind": "timing", **m.to_record()})
                say(str(m))
        dist.barrier()  # every rank is done with every collective
    except BaseException:
        teardown()
        raise
    exit_after_success(keep_group=True)  # done and recorded; past the barrier no peer waits for this rank


if __name__ == "__main__":
    main()
