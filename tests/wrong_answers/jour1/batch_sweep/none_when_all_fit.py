"""Reports a batch only from the out-of-memory handler: when every size fits, it returns None. Family: a case that
cannot show the mistake (every sweep tried ends in an out-of-memory error)."""
import torch

EXPECT = ["all fit", "the largest batch that fits is"]


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            return (results[-1]["batch_size"] if results else None), results
    return None, results
