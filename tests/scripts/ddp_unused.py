"""Worker for tests/test_ddp.py: the find_unused_parameters lesson, several cases in one run.

Run with ``launch(this, args=[case, ...], nproc=2)``; every case writes one record ``{"case": ..., ...}``.
Cases (all of them, in this order, when no argument is given):

* ``heads_error``  ConditionalHeadsNet under DDP *without* ``find_unused_parameters``, heads alternating
                   a, b, a: the second forward raises; the record keeps the step and the error's first line;
* ``heads_flag``   the same with ``find_unused_parameters=True``: every step runs, the unused head's
                   parameters stay equal on both ranks;
* ``stochastic``   StochasticDepthNet (p=0.5, so blocks really are dropped) without the flag: trains, and
                   the parameters stay identical across ranks.

Process start-up costs seconds, so one launch runs them all. After ``heads_error`` the broken DDP model
is thrown away; both ranks failed at the same point without a collective in flight, so the process
group is still usable for the next cases.
"""
import sys

import torch
import torch.distributed as dist
from torch import nn

import dlo  # noqa: F401  (must come before any torchvision import)
from dlo.models import ConditionalHeadsNet, StochasticDepthNet
from dlo.parallel.ddp import ddp_wrap
from dlo.runtime import first_line
from dlo.runtime import distributed, write_record

CASES = ("heads_error", "heads_flag", "stochastic")
STEPS = 3


def batch(step: int, rank: int, size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)  # each rank its own data, as with a sampler
    return torch.randn(size, 3, 8, 8, generator=gen), torch.randint(0, 10, (size,), generator=gen)


def same_on_all_ranks(model: nn.Module) -> bool:
    """True if every rank holds exactly the same parameters (DDP's promise)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(torch.equal(low, high))


def train_heads(ctx, **ddp_kwargs) -> dict:
    torch.manual_seed(0)
    model = ddp_wrap(ConditionalHeadsNet(num_classes=10, width=4), ctx, **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    try:
        for step in range(STEPS):
            x, y = batch(step, ctx.rank)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x, head=step % 2), y).backward()
            opt.step()
            done += 1
    except RuntimeError as exc:
        full = str(exc)
        return {"steps_done": done, "error": first_line(exc),
                "mentions_flag": "find_unused_parameters=True" in full}
    return {"steps_done": done, "error": None, "same_on_all_ranks": same_on_all_ranks(model.module)}


def train_stochastic(ctx) -> dict:
    torch.manual_seed(0)
    net = StochasticDepthNet(num_classes=10, width=4, depth=3, p=0.5)
    model = ddp_wrap(net, ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1000 + ctx.rank)  # each rank draws its own masks, as it would in real training
    before = [p.detach().clone() for p in net.parameters()]
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    changed = sum(not torch.equal(a, p) for a, p in zip(before, net.parameters()))
    return {"steps_done": STEPS, "params_changed": changed, "params_total": len(before),
            "same_on_all_ranks": same_on_all_ranks(net)}


def main(argv: list[str]) -> None:
    cases = argv or list(CASES)
    with distributed(backend="gloo", device="cpu") as ctx:
        for case in cases:
            if case == "heads_error":
                record = train_heads(ctx)
            elif case == "heads_flag":
                record = train_heads(ctx, find_unused_parameters=True)
            elif case == "stochastic":
                record = train_stochastic(ctx)
            else:
                raise ValueError(f"unknown case {case!r}: choose among {', '.join(CASES)}")
            write_record({"case": case, **record})
            dist.barrier()
            if ctx.is_main:
                print(f"case {case}: {record}")


if __name__ == "__main__":
    main(sys.argv[1:])
