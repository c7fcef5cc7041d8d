"""A correct alternative, written with a loop over the experts: count each expert's decisions with a comparison."""
import torch


def load_balancing_loss(router_probs, expert_index, num_experts):
    n, k = expert_index.shape
    loss = router_probs.new_zeros(())
    for e in range(num_experts):
        fraction = (expert_index == e).sum().item() / (n * k)
        loss = loss + fraction * router_probs[:, e].mean()
    return num_experts * loss
