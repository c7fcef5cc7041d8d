"""Goals and hints of the mixture-of-experts workshop (experts.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # mixture of experts
    ("experts", "balance"): _h(
        "Compute the load-balancing loss of a mixture of experts, E times the sum over the experts of the fraction "
        "of routing decisions sent to each expert times its mean router probability, so that the router learns to "
        "spread the tokens.",
        "f_e counts decisions (every one of the k choices of every token, out of n · k) and carries no gradient; "
        "P_e is the router's mean probability for e over the tokens and carries the gradient. Uniform routing gives "
        "1, every token on one expert gives E.",
        "torch.bincount(expert_index.flatten(), minlength=num_experts) (or one_hot(...).sum), divided by "
        "expert_index.numel(); router_probs.mean(dim=0); (f * P).sum() times num_experts."),
}
