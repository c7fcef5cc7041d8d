"""Goals and hints of the mixture-of-experts workshop (experts.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # mixture of experts
    ("experts", "balance"): _h(
        "Compute the load-balancing loss of a mixture of experts: one number, smallest when the routing decisions "
        "are spread evenly over the experts, that the router can lower through its probabilities, so that it learns "
        "to spread the tokens.",
        "Two views of each expert's load are multiplied: what the router did (the share of all routing decisions "
        "the expert received: a count, with no gradient) and what it believes (its mean probability for that "
        "expert: differentiable). The product is large for an expert that is both busy and favoured, and its "
        "gradient lowers the probability of busy experts only. The scale makes a perfectly even routing score 1, "
        "whatever the number of experts, and a collapsed one score the number of experts.",
        "torch.bincount (its minlength argument) or torch.nn.functional.one_hot; Tensor.reshape, Tensor.numel, "
        "Tensor.mean with dim, Tensor.to(dtype), Tensor.sum.",
        "First count, for every expert, the decisions that went to it among all n · k of them (every choice of "
        "every token; an expert nobody chose counts 0), and turn the counts into fractions of all decisions. Then "
        "average the router's probabilities over the tokens: one number per expert. Multiply the two per expert, "
        "add over the experts, scale by the number of experts. Keep the probabilities' dtype and the graph "
        "(no .item(), no detach on the probabilities)."),
}
