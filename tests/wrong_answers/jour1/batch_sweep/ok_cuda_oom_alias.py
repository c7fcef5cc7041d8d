"""Correct: torch.cuda.OutOfMemoryError is the same class; the results collected in a for/else."""
import torch


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            result = try_batch(bs)
        except torch.cuda.OutOfMemoryError:
            break
        results.append(result)
    return (results[-1]["batch_size"] if results else None), results
