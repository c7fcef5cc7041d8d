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
    ("experts", "routing"): _h(
        "Route each token to its k most probable experts (most probable first, ties to the lower expert index), "
        "with weights renormalised over those k choices, and mark which decisions fit in each expert's capacity, "
        "first choices served before second ones, so that every expert runs a bounded, predictable batch.",
        "A token's output mixes only its k experts, so their weights must sum to 1 while keeping the router's "
        "proportions (and its gradient). An expert has a fixed number of slots; when too many decisions reach it, "
        "which are dropped must be decided the same way everywhere: first choices matter more than second ones, so "
        "every first choice queues before any second choice, and earlier tokens queue first. A stable order makes "
        "ties (uniform rows, equal probabilities) give the same answer on every run and device.",
        "torch.sort(..., descending=True, stable=True) (torch.topk does not promise an order among ties); "
        "Tensor.sum(dim=-1, keepdim=True); torch.nn.functional.one_hot and Tensor.cumsum(0) to number each "
        "decision in its expert's queue; Tensor.t() / reshape to walk the decisions choice by choice.",
        "Rank each token's experts by decreasing probability, equal ones by increasing index, and keep the first k: "
        "their indices and their probabilities. Divide the k probabilities by their sum per token. For the "
        "capacity, list the decisions in priority order (all first choices in token order, then all second "
        "choices ...), give each its place in its own expert's queue (how many earlier decisions in that order "
        "chose the same expert), keep it when its place is below the capacity, and put the answers back in the "
        "[n, k] layout. No capacity: keep everything."),
    ("experts", "dispatch"): _h(
        "Send each of this rank's rows to the rank that holds its expert, run the experts there, and bring every "
        "output back to its row's place, with every rank taking part in every exchange even when it has no row, "
        "so that the experts can live on different GPUs.",
        "all_to_all_single moves one slice of a tensor to each rank, and needs on both sides the size of every "
        "slice: the receiver cannot guess how many rows a peer will send, so the counts travel first, in a small "
        "exchange of their own. Rows are sent grouped by destination (grouped by expert, since the experts of a "
        "rank are consecutive), and the answers come back in the order they left, so the caller's order must be "
        "restored at the end. Collectives are matched by order, not by content: a rank with nothing to send still "
        "joins each one, with empty tensors.",
        "torch.argsort(..., stable=True), torch.bincount(..., minlength=...), torch.distributed.all_to_all_single("
        "output, input, output_split_sizes, input_split_sizes, group=...), torch.distributed.get_world_size(group), "
        "Tensor.view / sum / tolist for the split sizes, Tensor.new_empty, torch.repeat_interleave, indexing "
        "with a permutation (or its inverse) for the way back.",
        "Group the rows by expert and remember that permutation. Count the rows for every expert; exchange those "
        "counts so that each rank learns how many rows every peer sends to each of its own experts. Add the counts "
        "per rank to get the sizes to send and to receive, and exchange the rows. On the receiving side, the rows "
        "come by source rank, and within a source by local expert: label each with its local expert from the "
        "counts, and call run_local once. Exchange the outputs back with the two lists of sizes swapped, and undo "
        "the permutation."),
}
