"""Averages the probabilities over the experts (dim=1) instead of the tokens: with as many tokens as experts the
shapes still broadcast, and P_e becomes the mean probability of token e, always 1/E."""
import torch

EXPECT = ["wrong axis", "dim 0"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    counts = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / expert_index.numel()
    p = router_probs.mean(dim=1)
    return num_experts * (f * p).sum()
