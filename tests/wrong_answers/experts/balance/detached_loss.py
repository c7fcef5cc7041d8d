"""Builds the result as a new tensor from Python numbers: the value is right but nothing flows back to the router,
which then never learns to balance."""
import torch

EXPECT = ["does not depend on router_probs", "gradient"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / expert_index.numel()
    value = num_experts * (f * router_probs.mean(0)).sum().item()
    return torch.tensor(value, dtype=router_probs.dtype)
