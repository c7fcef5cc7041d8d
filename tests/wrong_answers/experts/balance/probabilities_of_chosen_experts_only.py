"""Averages only the probabilities of the experts each token chose (the others set to zero): P_e then shrinks with
how rarely e is chosen and no longer is the router's mean belief over all the tokens."""
import torch

EXPECT = ["chosen experts", "every token"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    chosen = torch.zeros_like(router_probs).scatter(1, expert_index, 1.0)
    counts = chosen.sum(0) if expert_index.shape[1] == 1 else torch.bincount(
        expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    f = counts / expert_index.numel()
    p = (router_probs * chosen).mean(0)
    return num_experts * (f * p).sum()
