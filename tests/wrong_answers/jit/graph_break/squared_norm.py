"""Sum of squares without the square root: the scale factor uses the squared norm."""
import torch

EXPECT = "squared norm"


def clip_by_norm(x, max_norm=1.0):
    norm = (x * x).sum()
    return x * torch.clamp(max_norm / norm, max=1.0)
