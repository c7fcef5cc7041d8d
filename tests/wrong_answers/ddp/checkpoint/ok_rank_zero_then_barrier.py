"""Correct: rank 0 (ctx.rank == 0) writes through the package's atomic save_checkpoint; every rank then meets at the
barrier; the path returned on rank 0 only."""
import torch.distributed as dist

from dlo.training.checkpoint import save_checkpoint


def save_on_main(ctx, path, model, optimizer, epoch):
    result = None
    if ctx.rank == 0:
        result = save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return result
