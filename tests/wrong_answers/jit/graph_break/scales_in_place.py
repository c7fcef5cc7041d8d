"""Right factor, no graph break, but x is multiplied in place: the caller's tensor changes."""
import torch

EXPECT = "in place"


def clip_by_norm(x, max_norm=1.0):
    norm = torch.linalg.vector_norm(x)
    return x.mul_(torch.clamp(max_norm / norm, max=1.0))
