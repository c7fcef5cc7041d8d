"""Worker for tests/test_pipeline.py: one pipeline step per schedule on ``world_size`` gloo processes.

Every case writes one record per rank ``{"case": ..., "loss": ..., "grads": {name: [...]}, "after": {...},
"max_in_flight": ...}``: the gradients of this rank's parameters after one pipeline step and the
parameters after one SGD step. The test process rebuilds the same model and batch (``make_model``,
``make_batch``) for its single-process reference.
"""
import sys

import torch
import torch.distributed as dist

import dlo  # noqa: F401
from dlo.runtime import distributed, write_record
from dlo.models.llama import Llama, lm_loss, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel.pipeline import Pipe, build_chunks, build_stage, gather_stats, train_step

CFG = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=8, num_heads=4,
                        num_kv_heads=2, name="pipeline test")
BATCH, SEQ, MICRO, LR = 8, 8, 8, 0.5
OURS = ("naive", "afab", "afab_blocking", "1f1b", "1f1b_blocking", "interleaved", "interleaved_blocking")


def make_model() -> Llama:
    return Llama(CFG, seed=3)


def make_batch():
    return token_batch(BATCH, SEQ, CFG.vocab_size, seed=5)


def _named(stage_or_chunks) -> dict:
    mods = stage_or_chunks if isinstance(stage_or_chunks, list) else [stage_or_chunks]
    return {n: p for m in mods for n, p in m.named_parameters()}


def _finish(case, params, stats, extra=None) -> dict:
    grads = {n: p.grad.reshape(-1).tolist() for n, p in params.items()}
    with torch.no_grad():
        opt = torch.optim.SGD(params.values(), lr=LR)
        opt.step()
    after = {n: p.detach().reshape(-1).tolist() for n, p in params.items()}
    return {"case": case, "loss": stats["loss"], "grads": grads, "after": after, **(extra or {})}


def run(case: str, ctx) -> dict:
    p, rank = ctx.world_size, ctx.rank
    ids, labels = make_batch()
    model = make_model()
    if case in OURS:
        schedule = case.replace("_blocking", "")
        m = 1 if case == "naive" else MICRO
        stages = build_chunks(model, rank, p, 2) if schedule == "interleaved" else build_stage(model, rank, p)
        # blocking: a send returns only once its receiver has the data (gloo's blocking send, NCCL's rule for
        # large messages): a schedule whose transfers could wait for each other hangs here
        blocking = case == "naive" or case.endswith("_blocking")
        pipe = Pipe(stages, (ids, labels), m, rank=rank, world_size=p, blocking=blocking)
        step = train_step(pipe, schedule)
        stats, gathered = step.as_dict(), gather_stats(step)  # gathered: every rank's stats, on rank 0 only
        return _finish(case, _named(stages), stats, {"max_in_flight": stats["max_in_flight"], "micro_batches": m,
                                                     "peak_activation_bytes": stats["peak_activation_bytes"],
                                                     "events": stats["events"], "gathered": None if gathered is None else len(gathered)})
    if case in ("torch_gpipe", "torch_1f1b"):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = build_stage(model, rank, p)
        pstage = PipelineStage(stage, rank, p, torch.device("cpu"))
        cls = ScheduleGPipe if case == "torch_gpipe" else Schedule1F1B
        sched = cls(pstage, MICRO, loss_fn=lm_loss)
        losses: list = []
        if rank == 0:
            sched.step(ids)
        elif rank == p - 1:
            sched.step(target=labels, losses=losses)
        else:
            sched.step()
        t = torch.tensor([torch.stack(losses).mean().item() if losses else 0.0], dtype=torch.float64)
        dist.broadcast(t, src=p - 1)
        return _finish(case, _named(stage), {"loss": float(t.item())})
    raise ValueError(f"unknown case {case!r}")


def main(argv) -> None:
    cases = argv or [*OURS, "torch_gpipe", "torch_1f1b"]
    with distributed(backend="gloo", device="cpu") as ctx:
        for case in cases:
            write_record(run(case, ctx))
            dist.barrier()
            if ctx.is_main:
                print(f"case {case}: done")


if __name__ == "__main__":
    main(sys.argv[1:])
