"""Divides the counts by the number of tokens n instead of the number of decisions n · k: with top-2 the fractions
sum to 2 and the loss is twice the contract's."""
import torch

EXPECT = ["number of tokens", "n · k"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / router_probs.shape[0]
    return num_experts * (f * router_probs.mean(0)).sum()
