"""torch.clamp(max_norm / norm, min=1.0): scales small tensors up instead of large ones down."""
import torch

EXPECT = 'wrong values'


def clip_by_norm(x, max_norm=1.0):
    norm = torch.linalg.vector_norm(x)
    return x * torch.clamp(max_norm / norm, min=1.0)
