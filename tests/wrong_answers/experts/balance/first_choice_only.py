"""Counts only the first choice of each token (Switch's top-1 formula copied into a top-2 router): the second
choices, half of the work the experts do, are invisible to the loss."""
import torch

EXPECT = ["first choice", "all k choices"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    top1 = expert_index[:, 0]
    f = torch.bincount(top1, minlength=num_experts).to(router_probs.dtype) / top1.numel()
    return num_experts * (f * router_probs.mean(0)).sum()
