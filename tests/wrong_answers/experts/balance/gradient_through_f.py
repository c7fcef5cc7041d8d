"""Makes f "differentiable" with a straight-through trick (the counts' value, the probabilities' gradient): the value
is right, but the gradient now reaches the router through f as well as P, pushing the wrong way. Family: a value
right, the behaviour (the gradient) wrong."""
import torch

EXPECT = ["through f", "no gradient"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    hard = torch.bincount(expert_index.reshape(-1), minlength=num_experts).to(router_probs.dtype)
    hard = hard / expert_index.numel()
    soft = router_probs.mean(0)
    f = hard + soft - soft.detach()
    return num_experts * (f * router_probs.mean(0)).sum()
