"""Correct: a while loop over the sizes that stops at the first out-of-memory error (torch.OutOfMemoryError)."""
import torch


def largest_batch(try_batch, batch_sizes):
    results, i = [], 0
    while i < len(batch_sizes):
        try:
            results.append(try_batch(batch_sizes[i]))
        except torch.OutOfMemoryError:
            break
        i += 1
    return (results[-1]["batch_size"] if results else None), results
