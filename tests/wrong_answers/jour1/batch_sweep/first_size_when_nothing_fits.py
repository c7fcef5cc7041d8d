"""Starts from the first size as the answer: when even the first size runs out of memory it still reports it.
Family: an edge case (nothing fits) the fixed sweep did not reach."""
import torch

EXPECT = ["out of memory from", "the largest batch that fits is None"]


def largest_batch(try_batch, batch_sizes):
    best, results = batch_sizes[0], []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            break
        best = bs
    return best, results
