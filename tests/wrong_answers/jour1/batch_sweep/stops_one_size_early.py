"""Looks one size ahead and stops before the last size that fits "to keep a margin": the largest batch reported is
one below. Family: part of the result right (the results of the sizes tried), the batch not."""
import torch

EXPECT = ["the sizes tried were", "expected"]


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes[:-1]:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            break
    return (results[-1]["batch_size"] if results else None), results
