"""Recomputes the routing with topk on the probabilities instead of using expert_index: right when the router
takes the top-k of its softmax, wrong as soon as the decisions differ (noisy routing, jitter)."""
import torch

EXPECT = ["recomputed", "expert_index"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    k = expert_index.shape[1]
    chosen = router_probs.topk(k, dim=-1).indices
    f = torch.bincount(chosen.reshape(-1), minlength=num_experts).to(router_probs.dtype) / chosen.numel()
    return num_experts * (f * router_probs.mean(0)).sum()
