"""Forgets the factor E: Σ f_e · P_e alone is 1/E for a uniform routing, and the loss no longer reads 1 when balanced."""
import torch

EXPECT = ["factor E"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / expert_index.numel()
    return (f * router_probs.mean(0)).sum()
