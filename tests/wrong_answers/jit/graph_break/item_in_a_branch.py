"""Keeps `if norm.item() > max_norm`: a Python branch on tensor data breaks the graph."""
import torch

EXPECT = 'break'


def clip_by_norm(x, max_norm=1.0):
    norm = torch.linalg.vector_norm(x)
    if norm.item() > max_norm:
        return x * (max_norm / norm)
    return x
