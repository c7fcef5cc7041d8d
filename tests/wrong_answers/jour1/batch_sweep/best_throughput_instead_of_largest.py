"""Part of the result: reports the batch with the best throughput, which is not the largest that fits when throughput stops growing."""
import torch

EXPECT = 'best throughput'


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            break
    best = max(results, key=lambda r: r["throughput"]) if results else None
    return (best["batch_size"] if best else None), results
