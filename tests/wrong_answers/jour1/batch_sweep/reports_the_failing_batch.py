"""Returns the batch that failed instead of the last one that fitted."""
import torch

EXPECT = 'largest batch'


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            return bs, results
    return (results[-1]["batch_size"] if results else None), results
