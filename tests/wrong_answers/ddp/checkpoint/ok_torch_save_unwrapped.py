"""Correct: torch.save of the unwrapped state dict written by rank 0, then a barrier on every rank."""
import torch
import torch.distributed as dist


def save_on_main(ctx, path, model, optimizer, epoch):
    written = None
    if ctx.rank == 0:
        inner = getattr(model, "module", model)
        torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
        written = path
    if dist.is_initialized():
        dist.barrier()
    return written
