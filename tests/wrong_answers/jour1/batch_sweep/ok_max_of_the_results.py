"""Correct: the results collected in a loop with an else-free break, the largest batch taken as the max of the
sizes that fitted (the sizes are ascending), None when nothing fitted."""
import torch


def largest_batch(try_batch, batch_sizes):
    results = []
    for bs in batch_sizes:
        try:
            res = try_batch(bs)
        except torch.OutOfMemoryError:
            break
        else:
            results.append(res)
    best = max((r["batch_size"] for r in results), default=None)
    return best, results
