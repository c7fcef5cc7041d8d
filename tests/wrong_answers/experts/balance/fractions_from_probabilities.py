"""Takes the fractions from the router probabilities instead of the routing decisions: f = P, so the loss is
E · Σ P_e², which ignores where the tokens really went."""

EXPECT = ["router probabilities", "decisions"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    f = router_probs.mean(0)
    p = router_probs.mean(0)
    return num_experts * (f * p).sum()
