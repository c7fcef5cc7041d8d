"""Takes the norm along the last dimension: a matrix has each row clipped by its own norm, not by the whole tensor's."""
import torch

EXPECT = ["each row", "whole tensor"]


def clip_by_norm(x, max_norm=1.0):
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.clamp(max_norm / norm, max=1.0)
