"""Workshop -- pipeline parallelism: one Llama cut into stages, one process per stage, three schedules.

Each process holds a few consecutive decoder blocks of the model (stage 0 also the embedding, the last
stage the final norm, the LM head and the loss). A micro-batch's activations travel forward from stage to
stage, its activation gradients travel back. *Which* stage computes *what, when* is the schedule, and
that is what you write here, with the building blocks of ``dlo.parallel.pipeline.Pipe``:

    pipe.recv_forward(mb)               # -> the input of micro-batch mb (token ids on stage 0)
    pipe.forward_compute(mb, inputs)    # -> this stage's output; the loss / m on the last stage
    pipe.send_forward(mb, output)       # to the next stage (no-op on the last stage)
    pipe.recv_backward(mb)              # -> dL/d(output) from the next stage (None on the last stage)
    pipe.backward_compute(mb, grad)     # -> dL/d(inputs); gradients accumulate in the parameters' .grad
    pipe.send_backward(mb, input_grad)  # to the previous stage (no-op on stage 0)

(each takes an optional ``chunk=`` for the interleaved bonus). ``pipe.rank``, ``pipe.world_size`` (the
number of stages) and ``pipe.micro_batches`` are all a schedule needs to know. A send or a receive only
*asks* for a transfer: the Pipe posts everything asked for since the previous compute together, just
before the next compute (NCCL needs that to avoid deadlocks, see the notebook).

Run it:
    python pipeline_train.py                               # one process = one stage (no pipeline)
    torchrun --nproc_per_node 4 pipeline_train.py --schedules afab 1f1b --micro-batches 8
    dlo.runtime.launch("pipeline_train.py", [...], nproc=4)    # what the notebook does

Exercises 1-3 (and the bonus 4) are yours: in ``student/pipeline_train.py`` their bodies raise
NotImplementedError until you write them; ``dlo check pipeline <step>`` checks one.
"""
from __future__ import annotations

import argparse

from dlo.runtime.arguments import ScriptParser, at_least

#: The schedules a launch can ask for: ours (the exercises), then the same split run by libraries.
OUR_SCHEDULES = ("naive", "afab", "1f1b", "interleaved")
TORCH = ("torch_gpipe", "torch_1f1b")  # the same split run by torch.distributed.pipelining
LIBRARIES = (*TORCH, "deepspeed")  # ... and by DeepSpeed's PipelineModule (its own 1F1B)


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="pipeline_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=at_least(1), default=4)
    p.add_argument("--hidden", type=at_least(1), default=64)
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--vocab", type=at_least(1), default=256)
    p.add_argument("--seq", type=at_least(1), default=32)
    p.add_argument("--batch", type=at_least(1), default=16, help="sequences per optimizer step (the whole pipeline)")
    p.add_argument("--micro-batches", type=at_least(1), nargs="+", default=[8], help="m; naive always uses 1")
    p.add_argument("--schedules", nargs="+", default=["naive", "afab", "1f1b"], choices=[*OUR_SCHEDULES, *LIBRARIES])
    p.add_argument("--virtual", type=at_least(1), default=2, help="chunks per rank for the interleaved schedule")
    p.add_argument("--split", choices=("layers", "params"), default="layers")
    p.add_argument("--steps", type=at_least(1), default=5, help="timed steps per configuration")
    p.add_argument("--warmup-steps", type=at_least(0), default=2, help="untimed steps first")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=at_least(0), default=0)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked together (a micro-batch count that does not divide the batch, or too few stages for a
    schedule, is not refused here: that configuration is skipped with its reason, the others run)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.refuse(ValueError(f"argument --heads: {args.heads} heads do not divide --hidden {args.hidden}"))
    return args


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    parse_args()

import importlib.util
import statistics
import time

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.runtime import exit_after_success, init_distributed, teardown, write_record
from dlo.models.llama import Llama, lm_loss, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel.pipeline import (Pipe, bubble_fraction, bubble_theory, build_chunks, build_stage, check_world_size,
                                   gather_stats, interleaved_actions, micro_batch_size, split_layers, split_model)


# ---------------------------------------------------------------------------------------------------
# Exercise 1 -- naive model parallelism
# ---------------------------------------------------------------------------------------------------
def naive_step(pipe) -> None:
    """The whole batch is one micro-batch (``pipe.micro_batches == 1``): receive it, run this stage,
    send the result on; then receive the output's gradient, run the backward, send the input's gradient
    back. Stage k can only start once stage k-1 is done: every other stage waits."""
    # BEGIN SOLUTION: recv_forward(0) -> forward_compute(0, x) -> send_forward(0, y); then recv_backward(0) -> backward_compute(0, g) -> send_backward(0, dx)
    x = pipe.recv_forward(0)
    y = pipe.forward_compute(0, x)
    pipe.send_forward(0, y)
    g = pipe.recv_backward(0)
    dx = pipe.backward_compute(0, g)
    pipe.send_backward(0, dx)
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 2 -- GPipe: all forwards, then all backwards
# ---------------------------------------------------------------------------------------------------
def afab_step(pipe) -> None:
    """Cut the batch into ``pipe.micro_batches`` micro-batches. Run the forward (receive, compute, send) of
    micro-batch 0, 1, ..., m-1, then the backward (receive, compute, send) of micro-batch 0, 1, ..., m-1.
    While stage k works on micro-batch i, stage k-1 already works on micro-batch i+1. Every micro-batch
    must run backward: the gradients accumulate over the m of them."""
    # BEGIN SOLUTION: for mb in range(pipe.micro_batches): forward (recv, compute, send); then the same loop for the backward
    for mb in range(pipe.micro_batches):
        x = pipe.recv_forward(mb)
        y = pipe.forward_compute(mb, x)
        pipe.send_forward(mb, y)
    for mb in range(pipe.micro_batches):
        g = pipe.recv_backward(mb)
        dx = pipe.backward_compute(mb, g)
        pipe.send_backward(mb, dx)
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 3 -- 1F1B: one forward, one backward
# ---------------------------------------------------------------------------------------------------
def one_f_one_b_step(pipe) -> None:
    """Run every micro-batch's forward and backward so that a stage starts a backward as soon as it can and
    never holds more micro-batches' activations than it must: at most ``world_size - rank`` at once (the last stage
    one), instead of all m with AFAB, for the same bubble. The order has three phases -- forwards only, then one
    forward and one backward in turn (the backward of the oldest micro-batch still waiting), then the backwards
    left; how long the first one is, on each rank, is for you to work out (draw 4 stages and 8 micro-batches).
    Write each forward and each backward as receive-compute-send: the Pipe posts a forward's send together with
    the next backward's receive."""
    # BEGIN SOLUTION: warmup = min(pipe.world_size - pipe.rank - 1, m); warm-up forwards; for i in range(m - warmup): forward(warmup + i), backward(i); then backwards of the last warmup micro-batches
    m = pipe.micro_batches
    warmup = min(pipe.world_size - pipe.rank - 1, m)

    def forward(mb: int) -> None:
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))

    def backward(mb: int) -> None:
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Bonus 4 -- interleaved 1F1B (virtual stages)
# ---------------------------------------------------------------------------------------------------
def interleaved_step(pipe) -> None:
    """Each rank holds ``v = len(pipe.chunks)`` chunks: rank r runs virtual stages r, r+p, r+2p, ... A
    micro-batch goes through every virtual stage in order, so it visits each rank v times; the micro-batches
    enter in groups of p (``pipe.micro_batches`` must be a multiple of p: say so with a ValueError otherwise),
    and a group goes through one chunk before the next; backwards visit the chunks in reverse. As in 1F1B,
    forwards first, then one forward / one backward in turn, then the backwards left -- the warm-up is longer
    here (Megatron-LM's count: see the notebook). Pass ``chunk=`` to every Pipe call.

    Go **step by step**: a warm-up step is one forward, a steady step one forward *and* one backward, a
    cool-down step one backward. In a step, first ask for every input, then run the computes, then send the
    outputs: the Pipe posts a step's receives together with the previous step's sends. (Receive-compute-send
    for each action alone deadlocks on NCCL here: the ranks form a ring, the last one feeding rank 0's next
    chunk.)"""
    # BEGIN SOLUTION: a helper step(actions): inputs = [recv_* of each action], outputs = [*_compute of each], then send_* of each; warm-up steps [("F", k)], steady steps [("F", warmup + i), ("B", i)], cool-down steps [("B", k)], where ("F", k) is the k-th forward
    p, m, v = pipe.world_size, pipe.micro_batches, len(pipe.chunks)
    if m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in groups of {p}: use a multiple of {p}, not {m}")
    total = m * v

    def where(kind: str, k: int) -> tuple[int, int]:  # (micro-batch, chunk) of the k-th forward / backward
        group, w = divmod(k, p * v)
        mb, c = group * p + w % p, w // p
        return (mb, c) if kind == "F" else (mb, v - 1 - c)

    def step(actions: list[tuple[str, int]]) -> None:
        places = [(kind, *where(kind, k)) for kind, k in actions]
        inputs = [pipe.recv_forward(mb, chunk=c) if kind == "F" else pipe.recv_backward(mb, chunk=c)
                  for kind, mb, c in places]
        outputs = [pipe.forward_compute(mb, x, chunk=c) if kind == "F" else pipe.backward_compute(mb, x, chunk=c)
                   for (kind, mb, c), x in zip(places, inputs)]
        for (kind, mb, c), y in zip(places, outputs):
            if kind == "F":
                pipe.send_forward(mb, y, chunk=c)
            else:
                pipe.send_backward(mb, y, chunk=c)

    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + (v - 1) * p)
    for k in range(warmup):
        step([("F", k)])
    for i in range(total - warmup):
        step([("F", warmup + i), ("B", i)])
    for k in range(total - warmup, total):
        step([("B", k)])
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# The run itself (not an exercise)
# ---------------------------------------------------------------------------------------------------
OURS = {"naive": naive_step, "afab": afab_step, "1f1b": one_f_one_b_step, "interleaved": interleaved_step}
assert tuple(OURS) == OUR_SCHEDULES, "the parser's schedule names and the schedules defined here differ"


def why_invalid(args, world_size: int, schedule: str, m: int) -> str | None:
    """Why ``schedule`` with ``m`` micro-batches cannot run on ``world_size`` stages (None: it can), found
    with the same checks that would stop the run."""
    v = args.virtual if schedule == "interleaved" else 1
    if schedule in LIBRARIES and world_size == 1:
        return f"{schedule} needs at least 2 stages: launch with nproc >= 2"
    if schedule == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed in this Python (a GPU node may not have it): its row is left out"
    if v < 1:
        return f"virtual stages per rank must be >= 1, got {v}"
    try:
        micro_batch_size(args.batch, m)
        split_layers(args.layers, world_size * v)
        if schedule == "interleaved":
            interleaved_actions(0, world_size, m, v)
    except ValueError as exc:
        return str(exc)
    if schedule == "torch_1f1b" and m < world_size:
        return (f"torch.distributed.pipelining's Schedule1F1B needs at least as many micro-batches as stages: "
                f"{m} < {world_size}")
    return None


def plan(args, world_size: int) -> tuple[list[tuple[str, int]], list[dict]]:
    """Every (schedule, micro-batches) configuration of this launch, checked before anything runs: the valid
    ones in order, and one record per invalid one with the reason it is skipped (instead of stopping the
    whole launch halfway)."""
    runs, skipped = [], []
    for schedule in args.schedules:
        for m in ([1] if schedule == "naive" else args.micro_batches):
            reason = why_invalid(args, world_size, schedule, m)
            if reason is None:
                runs.append((schedule, m))
            else:
                skipped.append({"kind": "pipeline", "schedule": schedule, "micro_batches": m, "stages": world_size,
                                "skipped": reason})
    return runs, skipped


def _device(ctx) -> torch.device:
    return torch.device("cuda", ctx.local_rank) if torch.cuda.is_available() else torch.device("cpu")


def run_ours(args, ctx, device, schedule: str, m: int) -> dict:
    cfg = TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                            num_layers=args.layers, num_heads=args.heads, name="workshop llama")
    model = Llama(cfg, seed=args.seed)
    if schedule == "interleaved":
        stages = [c.to(device) for c in build_chunks(model, ctx.rank, ctx.world_size, args.virtual, by=args.split)]
    else:
        stages = build_stage(model, ctx.rank, ctx.world_size, by=args.split).to(device)
    params = [p for s in (stages if isinstance(stages, list) else [stages]) for p in s.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr)
    batch = token_batch(args.batch, args.seq, args.vocab, seed=args.seed)
    pipe = Pipe(stages, batch, m, rank=ctx.rank, world_size=ctx.world_size, device=device,
                blocking=schedule == "naive")
    times, bubbles, stats, losses = [], [], None, []
    for step in range(args.warmup_steps + args.steps):
        pipe.reset()
        opt.zero_grad(set_to_none=True)
        OURS[schedule](pipe)
        stats = pipe.finish()
        opt.step()
        losses.append(stats.loss)
        gathered = gather_stats(stats)
        if step >= args.warmup_steps and gathered is not None:
            times.append(max(s["step_s"] for s in gathered))
            bubbles.append(bubble_fraction(gathered)["bubble"])
    if gathered is None:
        return {}
    v = args.virtual if schedule == "interleaved" else 1
    return {"schedule": schedule, "micro_batches": m, "stages": ctx.world_size, "virtual": v,
            "step_s": statistics.median(times), "step_times_s": times, "bubble": statistics.median(bubbles),
            "bubble_theory": bubble_theory(ctx.world_size, m, v), "loss": losses[0], "final_loss": losses[-1],
            "max_in_flight": [s["max_in_flight"] for s in gathered],
            "peak_activation_bytes": [s["peak_activation_bytes"] for s in gathered],
            "peak_memory_bytes": [s["peak_memory_bytes"] for s in gathered],
            "events": [s["events"] for s in gathered], "layers": [list(s.layer_ids) for s in
                                                                  (stages if isinstance(stages, list) else [stages])]}


def run_torch(args, ctx, device, schedule: str, m: int) -> dict:
    """The same split, run by torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    cfg = TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                            num_layers=args.layers, num_heads=args.heads, name="workshop llama")
    stage = build_stage(Llama(cfg, seed=args.seed), ctx.rank, ctx.world_size, by=args.split).to(device)
    opt = torch.optim.AdamW(stage.parameters(), lr=args.lr)
    pstage = PipelineStage(stage, ctx.rank, ctx.world_size, device)
    sched = (ScheduleGPipe if schedule == "torch_gpipe" else Schedule1F1B)(pstage, m, loss_fn=lm_loss)
    ids, labels = (t.to(device) for t in token_batch(args.batch, args.seq, args.vocab, seed=args.seed))
    times, step_losses = [], []
    for step in range(args.warmup_steps + args.steps):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        losses: list = []
        if ctx.rank == 0:
            sched.step(ids)
        elif ctx.rank == ctx.world_size - 1:
            sched.step(target=labels, losses=losses)
        else:
            sched.step()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = torch.tensor([time.perf_counter() - start, torch.stack(losses).mean().item() if losses else 0.0],
                         dtype=torch.float64, device=device)
        step_t, loss_t = t[:1].clone(), t[1:].clone()
        dist.all_reduce(step_t, op=dist.ReduceOp.MAX)  # the step ends when the slowest stage is done
        dist.broadcast(loss_t, src=ctx.world_size - 1)  # the loss lives on the last stage
        step_losses.append(float(loss_t.item()))
        if step >= args.warmup_steps:
            times.append(float(step_t.item()))
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    peaks: list = [None] * ctx.world_size
    dist.all_gather_object(peaks, peak)
    return {"schedule": schedule, "micro_batches": m, "stages": ctx.world_size, "virtual": 1,
            "step_s": statistics.median(times), "step_times_s": times, "bubble": None, "bubble_theory": bubble_theory(ctx.world_size, m),
            "loss": step_losses[0], "final_loss": step_losses[-1], "max_in_flight": None,
            "peak_activation_bytes": None, "peak_memory_bytes": peaks, "events": None}


def run_deepspeed(args, ctx, device, schedule: str, m: int) -> dict:
    """The same model run by DeepSpeed's PipelineModule: one layer per piece (the embedding with the first
    block, the head with the last), cut uniformly into ``world_size`` stages; a plain torch optimizer
    (nothing for DeepSpeed to compile)."""
    from deepspeed.pipe import PipelineModule

    from dlo.runtime.compat import import_deepspeed

    deepspeed = import_deepspeed()  # on a CPU: keep torch's gloo, compile nothing

    cfg = TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                            num_layers=args.layers, num_heads=args.heads, name="workshop llama")
    pieces = split_model(Llama(cfg, seed=args.seed), args.layers)  # one block per piece
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # reuses the process group already there
    module = PipelineModule(layers=pieces, num_stages=ctx.world_size, loss_fn=lm_loss, partition_method="uniform")
    opt = torch.optim.AdamW([p for p in module.parameters()], lr=args.lr)
    config = {"train_batch_size": args.batch, "train_micro_batch_size_per_gpu": args.batch // m,
              "gradient_accumulation_steps": m, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=config)
    ids, labels = (t.to(device) for t in token_batch(args.batch, args.seq, args.vocab, seed=args.seed))
    mbs = args.batch // m
    times, step_losses = [], []
    for step in range(args.warmup_steps + args.steps):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        start = time.perf_counter()
        data = iter([(ids[i:i + mbs], labels[i:i + mbs]) for i in range(0, args.batch, mbs)])
        out = engine.train_batch(data_iter=data)  # forward + backward of m micro-batches + optimizer step
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_t = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(step_t, op=dist.ReduceOp.MAX)
        step_losses.append(float(out))  # the mean loss of the m micro-batches (DeepSpeed shares it with all stages)
        if step >= args.warmup_steps:
            times.append(float(step_t.item()))
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    peaks: list = [None] * ctx.world_size
    dist.all_gather_object(peaks, peak)
    return {"schedule": schedule, "micro_batches": m, "stages": ctx.world_size, "virtual": 1,
            "step_s": statistics.median(times), "step_times_s": times, "bubble": None, "bubble_theory": bubble_theory(ctx.world_size, m),
            "loss": step_losses[0], "final_loss": step_losses[-1], "max_in_flight": None, "peak_activation_bytes": None, "peak_memory_bytes": peaks,
            "events": None}


def main(argv=None) -> None:
    args = parse_args(argv)
    ctx = init_distributed()
    device = _device(ctx)
    check_world_size(ctx.world_size, ctx.world_size)  # one stage per process (no data parallelism here)
    say = print if ctx.is_main else (lambda *a, **k: None)
    say(f"{ctx.world_size} stage(s), one per process, on {device.type}; model: {args.layers} layers, hidden "
        f"{args.hidden}, vocab {args.vocab}; batch {args.batch} x {args.seq} tokens")
    runs, skipped = plan(args, ctx.world_size)
    for rec in skipped:  # one line each, kept in the results
        say(f"{rec['schedule']:12s} m={rec['micro_batches']:<3d} skipped: {rec['skipped']}")
        if ctx.is_main:
            write_record(rec)
    try:
        for schedule, m in runs:
            runner = run_deepspeed if schedule == "deepspeed" else run_torch if schedule in TORCH else run_ours
            record = runner(args, ctx, device, schedule, m)
            if ctx.is_main:
                write_record({"kind": "pipeline", **record})
                bub = "" if record["bubble"] is None else f", bubble {record['bubble']:.2f} " \
                                                          f"(theory {record['bubble_theory']:.2f})"
                say(f"{schedule:12s} m={m:<3d} step {record['step_s'] * 1e3:8.1f} ms{bub}, "
                    f"loss {record['loss']:.4f}")
    finally:
        teardown()


if __name__ == "__main__":
    main()
    exit_after_success()  # DeepSpeed's globals can abort a finished rank at interpreter exit
