"""except Exception: a real bug reads as 'out of memory'."""
import torch

EXPECT = 'only torch.OutOfMemoryError'


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except Exception:
            break
    return (results[-1]["batch_size"] if results else None), results
