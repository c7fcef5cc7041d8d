"""Worker for tests/test_ddp.py: DDP training compared with one process, comm hook records, metrics.

Run with ``launch(this, args=[case, ...], nproc=2)``; every case writes one record ``{"case": ..., ...}``.
Cases (all of them when no argument is given):

* ``plain``   DDP, model without BatchNorm, STEPS SGD steps, each rank on its half of a fixed global
              batch -> final parameters (the test compares them with one process on the whole batch);
* ``hook``    the same with :func:`dlo.parallel.ddp.attach_comm_recorder` -> parameters + the recorder's records;
* ``double``  the classic mistake: loss divided by the world size on top of DDP's averaging;
* ``bn``      model with plain BatchNorm under DDP (per-rank statistics);
* ``syncbn``  the same converted with ``nn.SyncBatchNorm.convert_sync_batchnorm``: on CPU it raises
              (SyncBatchNorm runs on GPUs only) and the error is recorded; on a GPU it trains;
* ``buckets`` a wider MLP under several ``bucket_cap_mb`` -> the recorder's per-step summary;
* ``reduce``  :func:`dlo.parallel.ddp.reduce_mean` / :func:`dlo.parallel.ddp.reduce_sum` of rank-dependent values.

The test process imports this file to rebuild the very same models and batches (``make_model``,
``global_batches``, ``train``) for its single-process reference.
"""
import sys

import torch
import torch.distributed as dist
from torch import nn

import dlo  # noqa: F401  (must come before any torchvision import)
from dlo.parallel.ddp import attach_comm_recorder, ddp_wrap, reduce_mean, reduce_sum
from dlo.runtime import first_line
from dlo.runtime import distributed, write_record

STEPS = 3
GLOBAL_BATCH = 16
LR, MOMENTUM = 0.1, 0.9
CASES = ("plain", "hook", "double", "bn", "syncbn", "buckets", "reduce")


def make_model(kind: str) -> nn.Module:
    """Identical initial weights on every rank and in the test process (fixed seed)."""
    torch.manual_seed(1234)
    if kind == "mlp":  # no BatchNorm: DDP must match one process exactly (up to float rounding)
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                             nn.Linear(32, 10))
    if kind == "bn":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    if kind == "wide":  # several buckets with a small bucket_cap_mb
        layers = [nn.Flatten(), nn.Linear(3 * 8 * 8, 64)]
        for _ in range(6):
            layers += [nn.ReLU(), nn.Linear(64, 64)]
        return nn.Sequential(*layers, nn.ReLU(), nn.Linear(64, 10))
    raise ValueError(f"unknown model kind {kind!r}")


def global_batches(steps: int = STEPS, batch: int = GLOBAL_BATCH) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed global batches. The second half is shifted so that the two ranks' halves have different
    statistics (which is what makes per-rank BatchNorm differ from whole-batch BatchNorm)."""
    gen = torch.Generator().manual_seed(99)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, 3, 8, 8, generator=gen)
        x[batch // 2:] = 2.0 * x[batch // 2:] + 1.0
        y = torch.randint(0, 10, (batch,), generator=gen)
        out.append((x, y))
    return out


def train(model: nn.Module, batches, rank: int = 0, world: int = 1, loss_scale: float = 1.0,
          device: str = "cpu", lr: float = LR) -> nn.Module:
    """SGD with momentum; rank ``rank`` of ``world`` takes its contiguous slice of each global batch."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    for x, y in batches:
        per_rank = x.shape[0] // world
        part = slice(rank * per_rank, (rank + 1) * per_rank)
        xs, ys = x[part].to(device), y[part].to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xs), ys) * loss_scale
        loss.backward()
        opt.step()
    return model


def flat_params(model: nn.Module) -> list[float]:
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return torch.cat([p.detach().reshape(-1).cpu().double() for p in module.parameters()]).tolist()


def run(case: str, ctx) -> dict:
    world, rank = ctx.world_size, ctx.rank
    if case == "plain":
        model = ddp_wrap(make_model("mlp"), ctx)
        return {"params": flat_params(train(model, global_batches(), rank, world))}
    if case == "hook":
        model = ddp_wrap(make_model("mlp"), ctx)
        recorder = attach_comm_recorder(model)
        train(model, global_batches(), rank, world)
        return {"params": flat_params(model), "records": recorder.records, "summary": recorder.summary()}
    if case == "double":
        model = ddp_wrap(make_model("mlp"), ctx)
        return {"params": flat_params(train(model, global_batches(), rank, world, loss_scale=1.0 / world))}
    if case == "bn":
        model = ddp_wrap(make_model("bn"), ctx)
        return {"params": flat_params(train(model, global_batches(), rank, world))}
    if case == "syncbn":
        device = "cpu"
        if torch.cuda.is_available():  # gloo also moves CUDA tensors, so both ranks may share one GPU
            device = f"cuda:{ctx.local_rank % torch.cuda.device_count()}"
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 for a tight comparison with the CPU reference
            torch.backends.cudnn.allow_tf32 = False
        try:  # on CPU, DDP's constructor already refuses ("SyncBatchNorm layers only work with GPU modules")
            model = ddp_wrap(nn.SyncBatchNorm.convert_sync_batchnorm(make_model("bn")), ctx, device=device)
            train(model, global_batches(), rank, world, device=device)
        except ValueError as exc:
            return {"device": device, "error": first_line(exc)}
        return {"device": device, "params": flat_params(model)}
    if case == "buckets":
        out = {"param_elements": sum(p.numel() for p in make_model("wide").parameters()), "caps": {}}
        for cap in (0.02, 25):
            model = ddp_wrap(make_model("wide"), ctx, bucket_cap_mb=cap)
            recorder = attach_comm_recorder(model)
            train(model, global_batches(), rank, world)
            out["caps"][str(cap)] = {"summary": recorder.summary(), "records": recorder.records}
        return out
    if case == "reduce":
        return {
            "mean_float": reduce_mean(float(rank + 1)),
            "mean_tensor": reduce_mean(torch.tensor([rank + 1.0, 10.0 * rank])),
            "sum_int_tensor": reduce_sum(torch.tensor([rank + 1])),
        }
    raise ValueError(f"unknown case {case!r}: choose among {', '.join(CASES)}")


def main(argv: list[str]) -> None:
    cases = argv or list(CASES)
    with distributed(backend="gloo", device="cpu") as ctx:
        for case in cases:
            record = run(case, ctx)
            write_record({"case": case, **record})
            if ctx.is_distributed:
                dist.barrier()
            if ctx.is_main:
                print(f"case {case}: done")


if __name__ == "__main__":
    main(sys.argv[1:])
