"""Sums the probabilities over the tokens instead of averaging them: the loss grows with the batch size."""
import torch

EXPECT = ["mean probability"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / expert_index.numel()
    return num_experts * (f * router_probs.sum(0)).sum()
