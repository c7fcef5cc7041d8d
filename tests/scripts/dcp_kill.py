"""A sharded save killed at one phase, then resumed: the loaded weights are those of the step the load reports.

Usage: ``dcp_kill.py OUT_DIR save PHASE-rVICTIM`` trains a small FSDP2 model, saves a complete checkpoint at step 3,
trains to step 6, then saves again with rank VICTIM killed (``os._exit``) at PHASE; rank 0 writes the full weights of
steps 3 and 6 beside. ``dcp_kill.py OUT_DIR load LABEL [LABEL ...]`` loads each label's folder into a model of other
weights and records the step it reports and whether every weight equals that step's.
"""
import os
import sys
from pathlib import Path

import torch
from torch import nn

import dlo  # noqa: F401
from dlo.parallel.fsdp import checkpoint as ckpt
from dlo.parallel.fsdp import sharded_folders as folders
from dlo.runtime import exit_after_success, init_distributed, write_record

out, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)


def build(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 5))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def train(model, opt, start, steps):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 * step + ctx.rank)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 5, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def full(model):
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def die(*_a, **_k):
    os._exit(9)


def after(fn):
    def wrapped(*a, **k):
        result = fn(*a, **k)
        if hasattr(result, "wait"):
            result.wait()
        os._exit(9)
    return wrapped


def install(phase, victim):
    if ctx.rank != victim:
        return
    from torch.distributed.checkpoint import FileSystemWriter

    if phase == "start":
        ckpt._write_shards = die
    elif phase == "own_shard_written":  # this rank's file is on disk, the .metadata is not
        FileSystemWriter.write_data = after(FileSystemWriter.write_data)
    elif phase == "before_metadata":
        FileSystemWriter.finish = die
    elif phase == "shards_written":  # every file of this rank written, before the barrier
        ckpt._write_shards = after(ckpt._write_shards)
    elif phase == "marker_written":  # the commit marker is there, the rename is not done
        folders.atomic_write_text = after(folders.atomic_write_text)
    elif phase == "committed":  # renamed, the older checkpoint not yet removed
        folders.prune = die
    else:
        raise SystemExit(f"unknown phase {phase}")


if mode == "save":
    label = args[0]
    phase, victim = label.rsplit("-r", 1)[0], int(label.rsplit("-r", 1)[1])
    model, opt = build(0)
    root = out / label
    train(model, opt, 0, 3)
    ckpt.save_sharded(root, model, opt, step=3)
    expected3 = full(model)
    train(model, opt, 3, 3)
    expected6 = full(model)
    if ctx.rank == 0:
        torch.save({3: expected3, 6: expected6}, out / f"{label}-expected.pt")
    torch.distributed.barrier()
    install(phase, victim)
    ckpt.save_sharded(root, model, opt, step=6)
    write_record({"label": label, "finished": True})
else:
    for label in args:
        model, opt = build(123)
        step = ckpt.load_sharded(out / label, model, opt)
        expected = torch.load(out / f"{label}-expected.pt", weights_only=True)
        got = full(model)
        write_record({"label": label, "step": step,
                      "equal": all(torch.equal(got[k], v) for k, v in expected[step].items()),
                      "equal_other": all(torch.equal(got[k], v) for k, v in expected[9 - step].items())})
exit_after_success()
