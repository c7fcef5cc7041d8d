"""x * max_norm / norm without the clamp: small tensors are scaled up to max_norm instead of left unchanged."""
import torch

EXPECT = "unchanged"


def clip_by_norm(x, max_norm=1.0):
    return x * (max_norm / torch.linalg.vector_norm(x))
