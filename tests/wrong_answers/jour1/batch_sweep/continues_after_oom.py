"""Keeps trying larger batches after the first out-of-memory error."""
import torch

EXPECT = 'stop at the first'


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            continue
    return (results[-1]["batch_size"] if results else None), results
