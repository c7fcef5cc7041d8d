"""Capstone -- PP × TP × DP: one Llama training step on a ``dp × pp × tp`` grid of processes.

Each process sits at one point of a :class:`dlo.runtime.Grid` (tp innermost): the ``tp`` ranks of a pipeline
stage hold the tensor-parallel slices of that stage's decoder blocks, the pipeline schedule sends
activations and gradients between the ranks of the same tp coordinate on neighbouring stages, and after the
schedule the gradients are averaged over the ``dp`` replicas, each of which worked on its own share of the
batch (:mod:`dlo.parallel.grid_step`).

One record per rank and per schedule: the loss of the global batch, the step time, the parameter bytes this
rank holds and the activation bytes it kept for backward at most, its communication per axis (measured by
:data:`dlo.parallel.comm.COUNTER` and predicted by :func:`dlo.parallel.grid_step.comm_theory`), and with
``--compare`` the largest difference with one process running the whole model on the whole batch (loss,
gradients, weights after one SGD step); ``--dump`` adds the full gathered gradients and weights.

Run it:
    python grid_train.py                                     # one process: dp = pp = tp = 1
    torchrun --nproc_per_node 8 grid_train.py --dp 2 --pp 2 --tp 2 --compare
    dlo.runtime.launch("grid_train.py", ["--dp", "2", "--pp", "2", "--tp", "2"], nproc=8)   # the notebook
Processes use gloo on the CPU, or NCCL with one GPU each on a GPU node (as the other workers).
"""
from __future__ import annotations

import argparse
from typing import NoReturn

from dlo.runtime.arguments import ScriptParser, at_least
from dlo.runtime.context import dist_context

SCHEDULE_NAMES = ("afab", "1f1b", "interleaved")  # dlo.parallel.grid_step.SCHEDULES, without importing torch
DTYPE_NAMES = ("float32", "bfloat16")


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="grid_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--dp", type=at_least(1), default=1)
    p.add_argument("--pp", type=at_least(1), default=1)
    p.add_argument("--tp", type=at_least(1), default=1)
    p.add_argument("--schedules", nargs="+", default=["1f1b"], choices=SCHEDULE_NAMES)
    p.add_argument("--micro-batches", type=at_least(1), default=4, help="per data-parallel replica")
    p.add_argument("--virtual", type=at_least(1), default=2, help="chunks per pipeline rank for the interleaved schedule")
    p.add_argument("--layers", type=at_least(1), default=4)
    p.add_argument("--hidden", type=at_least(1), default=32)
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--kv-heads", type=at_least(1), default=4)
    p.add_argument("--intermediate", type=at_least(1), default=96)
    p.add_argument("--vocab", type=at_least(1), default=96)
    p.add_argument("--seq", type=at_least(1), default=8)
    p.add_argument("--batch", type=at_least(1), default=16, help="sequences per optimizer step, over the dp replicas")
    p.add_argument("--steps", type=at_least(1), default=1, help="timed steps")
    p.add_argument("--warmup-steps", type=at_least(0), default=0, help="untimed steps before them (the very first "
                   "step is the one compared with one process and whose communication is recorded, timed or not)")
    p.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--blocking", action="store_true", help="every batch of transfers is waited for, sends included "
                   "(a send waits for its receiver, as NCCL's large messages do): a schedule that could hang on GPUs "
                   "hangs here")
    p.add_argument("--compare", action="store_true", help="compare the first step with one process (fp32)")
    p.add_argument("--dump", action="store_true", help="record the full gradients and weights (tiny models only)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch % (args.dp * args.micro_batches):
        parser.refuse(ValueError(f"argument --batch: {args.batch} sequences do not split into --dp {args.dp} "
                                 f"replicas x --micro-batches {args.micro_batches}"))
    return args


def refuse_layout(reason: str) -> NoReturn:
    """The one line saying why this launch's layout cannot run, exit code 2. Every rank finds the same reason and
    says it: a launcher stops the other ranks at the first that fails, so a line left to rank 0 could be lost."""
    build_parser().refuse(ValueError(reason))


def layout_mismatch(args, world_size: int) -> str | None:
    if args.dp * args.pp * args.tp != world_size:
        return (f"layout --dp {args.dp} x --pp {args.pp} x --tp {args.tp} = {args.dp * args.pp * args.tp} "
                f"processes, but this launch has {world_size}")
    return None


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    # torchrun's or srun's variables tell the launch's process count: no process group yet
    if (_reason := layout_mismatch(parse_args(), dist_context().world_size)) is not None:
        refuse_layout(_reason)

import statistics
import time

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.runtime import Grid, init_distributed, teardown, write_record
from dlo.models.config import TransformerConfig
from dlo.models.llama import Llama, token_batch
from dlo.parallel import comm
from dlo.parallel.grid_step import (SCHEDULES, GridPipe, build_grid_chunks, by_axis, comm_theory, gathered_tensors,
                                    grid_train_step, param_count, replica_batch, why_invalid)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
assert tuple(SCHEDULES) == SCHEDULE_NAMES and tuple(DTYPES) == DTYPE_NAMES


def make_config(args) -> TransformerConfig:
    return TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                             num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                             name="grid llama")


def make_batch(args) -> tuple[torch.Tensor, torch.Tensor]:
    return token_batch(args.batch, args.seq, args.vocab, seed=args.seed + 1)


def reference_step(args, device: torch.device | str = "cpu") -> dict:
    """One process, the whole model, the whole batch, fp32 on ``device``: loss, gradients, weights after one SGD
    step (returned on the CPU)."""
    model = Llama(make_config(args), seed=args.seed).to(device)
    ids, labels = (t.to(device) for t in make_batch(args))
    loss = model.loss(ids, labels)
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=args.lr).step()
    return {"loss": loss.item(), "grads": grads, "after": {n: p.detach().cpu() for n, p in model.named_parameters()}}


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _max_diff(mine: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    return max(((t.float().cpu() - ref[n]).abs().max().item() for n, t in mine.items()), default=0.0)


def run_schedule(args, ctx, device, grid: Grid, groups: dict, schedule: str, reference: dict | None) -> dict:
    where = grid.coords(ctx.rank)
    cfg, dtype = make_config(args), DTYPES[args.dtype]
    virtual = args.virtual if schedule == "interleaved" else 1
    chunks = [c.to(device=device, dtype=dtype)
              for c in build_grid_chunks(Llama(cfg, seed=args.seed), where["pp"], grid.pp, virtual=virtual,
                                         tp_group=groups["tp"])]
    params = [p for c in chunks for p in c.parameters()]
    opt = torch.optim.SGD(params, lr=args.lr)
    batch = replica_batch(make_batch(args), grid.dp, where["dp"])
    pipe = GridPipe(chunks if len(chunks) > 1 else chunks[0], batch, args.micro_batches, rank=where["pp"],
                    world_size=grid.pp, device=device, dtype=dtype, group=groups["pp"], blocking=args.blocking)
    record: dict = {"kind": "grid", "schedule": schedule, "dp": grid.dp, "pp": grid.pp, "tp": grid.tp,
                    "micro_batches": args.micro_batches, "virtual": virtual, "coords": where,
                    "stages": [c.index for c in chunks], "layers": [c.layer_ids for c in chunks],
                    "dtype": args.dtype, "world_size": ctx.world_size, "blocking": args.blocking,
                    "tokens_per_step": args.batch * args.seq}
    times = []
    for step in range(args.warmup_steps + args.steps):
        opt.zero_grad(set_to_none=True)
        comm.COUNTER.reset()
        if ctx.is_distributed:
            dist.barrier()
        start = time.perf_counter()
        stats = grid_train_step(pipe, schedule, chunks, groups["dp"])
        summary = comm.COUNTER.summary()  # this step's communication, before the bookkeeping below
        first = step == 0
        if first and (args.compare or args.dump):
            grads = gathered_tensors(chunks, groups["tp"], grads=True)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        t = torch.tensor([stats.loss, elapsed], dtype=torch.float64, device=device)
        if ctx.is_distributed:  # the global batch's loss (mean over replicas); the step ends with the slowest rank
            loss_t, time_t = t[:1].clone(), t[1:].clone()
            dist.all_reduce(loss_t, group=groups["dp"])
            dist.all_reduce(time_t, op=dist.ReduceOp.MAX)
            t = torch.cat([loss_t / grid.dp, time_t])
        if step >= args.warmup_steps:
            times.append(float(t[1]))
        if first:
            record.update(loss=float(t[0]), comm=[{"op": o, "phase": ph, **v} for (o, ph), v in summary.items()],
                          peak_saved_bytes=stats.peak_activation_bytes, max_in_flight=stats.max_in_flight,
                          pp_peers=sorted(pipe.peers))
            if args.compare or args.dump:
                after = gathered_tensors(chunks, groups["tp"])
            if args.dump:
                record["grads"] = {n: g.float().reshape(-1).tolist() for n, g in grads.items()}
                record["after"] = {n: a.float().reshape(-1).tolist() for n, a in after.items()}
            if reference is not None:
                record["diff"] = {"loss": abs(float(t[0]) - reference["loss"]),
                                  "grad": _max_diff(grads, reference["grads"]),
                                  "after": _max_diff(after, reference["after"])}
    theory = comm_theory(cfg, grid, ctx.rank, batch=args.batch, seq=args.seq, micro_batches=args.micro_batches,
                         virtual=virtual, dtype_bytes=torch.tensor([], dtype=dtype).element_size())
    measured = {(c["op"], c["phase"]): {"calls": c["calls"], "bytes": c["bytes"]} for c in record["comm"]}
    record.update(
        comm_theory=[{"op": o, "phase": ph, **v} for (o, ph), v in theory.items()],
        comm_matches_theory=measured == theory,
        axis=by_axis(measured), axis_theory=by_axis(theory),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        param_bytes_theory=param_count(cfg, pp=grid.pp, tp=grid.tp, pp_index=where["pp"], virtual=virtual)
        * torch.tensor([], dtype=dtype).element_size(),
        peak_memory_bytes=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
        step_s=statistics.median(times), step_times_s=times)
    return record


def main(argv=None) -> None:
    args = parse_args(argv)
    launch = dist_context()  # checked before any process group, model or data
    cfg = make_config(args)
    for schedule in args.schedules:
        reason = why_invalid(cfg, world_size=launch.world_size, dp=args.dp, pp=args.pp, tp=args.tp, batch=args.batch,
                             micro_batches=args.micro_batches, schedule=schedule, virtual=args.virtual)
        if reason is not None:
            refuse_layout(f"layout dp={args.dp} pp={args.pp} tp={args.tp} ({schedule}) cannot run: {reason}")
    ctx = init_distributed()
    device = _device()
    say = print if ctx.is_main else (lambda *a, **k: None)
    grid = Grid(ctx.world_size, dp=args.dp, pp=args.pp, tp=args.tp)
    groups = grid.new_groups(ctx.rank, axes=("dp", "pp", "tp")) if ctx.is_distributed else {
        "dp": None, "pp": None, "tp": None}
    say(f"{ctx.world_size} process(es) on {device.type}: dp={grid.dp} x pp={grid.pp} x tp={grid.tp}\n{grid.describe()}")
    reference = reference_step(args, device) if args.compare else None
    try:
        for schedule in args.schedules:
            record = run_schedule(args, ctx, device, grid, groups, schedule, reference)
            write_record(record)
            diff = record.get("diff")
            versus = "" if not diff else (f", max |diff| vs one process: grad {diff['grad']:.1e}, "
                                          f"weights {diff['after']:.1e}")
            say(f"{schedule:12s} loss {record['loss']:.5f}, step {record['step_s'] * 1e3:.1f} ms, comm "
                f"{'= theory' if record['comm_matches_theory'] else '!= theory'}{versus}")
    finally:
        teardown()


if __name__ == "__main__":
    main()
