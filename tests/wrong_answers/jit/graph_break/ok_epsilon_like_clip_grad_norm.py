"""Correct: the coefficient max_norm / (norm + 1e-6) capped at 1, as torch.nn.utils.clip_grad_norm_ computes it (the
epsilon keeps a zero tensor finite), with no Python branch."""
import torch


def clip_by_norm(x, max_norm=1.0):
    coef = max_norm / (torch.linalg.vector_norm(x) + 1e-6)
    return x * coef.clamp(max=1.0)
