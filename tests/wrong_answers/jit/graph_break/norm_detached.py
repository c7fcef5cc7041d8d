"""Family: values checked, gradients not. The norm detached before the scale is taken ("the scale is a constant"): the
values are right, but the gradient misses the scale's own dependence on x."""
import torch

EXPECT = "gradient of x"


def clip_by_norm(x, max_norm=1.0):
    norm = torch.linalg.vector_norm(x).detach()
    return x * torch.clamp(max_norm / norm, max=1.0)
