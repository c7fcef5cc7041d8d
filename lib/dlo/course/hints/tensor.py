"""Goals and hints of the tensor-parallel workshop (tensor_parallel, context_parallel, attention): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # tensor parallel
    ("tp", "1"): _h(
        "Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, "
        "gather, scatter), as each class docstring describes.",
        "A collective in the forward has a conjugate in the backward: if the forward hands every rank the same "
        "tensor, the ranks' gradients of it are partial and must be summed; if the forward sums partials, the sum's "
        "gradient reaches every partial unchanged; gathering and keeping one's slice are each other's gradient.",
        "torch.autograd.Function with static forward/backward, ctx to carry the group; dlo.parallel.comm.all_reduce, "
        "all_gather_last_dim, split_last_dim, each with the group and phase='forward' or 'backward'; backward "
        "returns one gradient per forward input (None for the group).",
        shape="For each primitive: what the forward returns from the input (itself, the group's sum, the ranks' "
              "slices side by side, this rank's slice), then what the backward returns from the incoming gradient "
              "-- the adjoint of the forward, with at most one collective in either direction."),
    ("tp", "2"): _h(
        "Split a linear layer by output features across the TP group (column parallel).",
        "Each output feature depends on the whole input, so the output features can be shared out with no "
        "communication forward; the input, used by every rank, gets its gradient as a sum over the ranks.",
        "nn.Parameter of a cloned slice of full.weight / full.bias; F.linear; copy_to_region on the input, "
        "gather_from_region on the output when gather_output.",
        shape="At construction: this rank's share of the output features, taken from the full weight and bias and "
              "owned by the layer. In forward: the input through f when asked, the local linear, then the "
              "outputs put back side by side only when the caller wants them whole."),
    ("tp", "3"): _h(
        "Split a linear layer by input features across the TP group (row parallel).",
        "A matrix product is a sum over the input features: each rank computes the part of the sum its features "
        "give, and one all-reduce adds the parts; a bias added on every rank would be counted tp times.",
        "A cloned column slice of full.weight as nn.Parameter, the whole bias cloned; F.linear without bias; "
        "reduce_from_region.",
        shape="At construction: this rank's share of the input features (of the weight), the bias whole. In "
              "forward: the partial product of this rank's features, the sum over the group, then the bias once."),
    ("tp", "4"): _h(
        "Split the embedding table by vocabulary across the TP group.",
        "A rank can only look up the ids of its range; if it answers zero for the others, the sum over the ranks "
        "is the lookup of the full table, exactly one rank contributing each row.",
        "Boolean masks on the ids, F.embedding on ids shifted into the local range, masked_fill or a 0/1 "
        "multiplication, reduce_from_region.",
        shape="From the ids: which belong to this rank; a lookup in the local table that cannot go out of range "
              "for the others; their rows made zero; then the sum over the group."),
    ("tp", "5"): _h(
        "Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward.",
        "Gate and up split by output features and down by input features line up: each rank's hidden activations "
        "are exactly the ones its slice of down needs, so nothing is exchanged in between.",
        "Your ColumnParallelLinear (copy_input=False) and RowParallelLinear; copy_to_region once in forward.",
        shape="Three parallel layers built from the full MLP's three; in forward the input passes f once, feeds "
              "both column-parallel layers, their gated product feeds the row-parallel one, whose sum is the "
              "output."),
    ("tp", "6"): _h(
        "Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not "
        "divide the heads.",
        "Heads are independent until the output projection: each rank can own whole heads (query heads and the "
        "K/V heads they share), and the output projection sums the ranks' contributions like a row-parallel layer.",
        "_divisible for both head counts; ColumnParallelLinear(copy_input=False) for q, k, v; RowParallelLinear for "
        "o; view/transpose to [batch, heads, seq, head_dim]; apply_rotary; causal_attention.",
        shape="Local head counts from the full ones and tp (with a clear error when they do not divide); in "
              "forward: f once, the three projections cut into this rank's heads, rotary on q and k, attention, "
              "the heads flattened back (their width is local heads x head_dim), the output projection."),
    ("tp", "7"): _h(
        "Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names.",
        "The TP model is the same network with each layer replaced by its parallel version; keeping the names "
        "lets the single-process model's weights and gradients be compared one by one.",
        "VocabParallelEmbedding, TPDecoderBlock, copy.deepcopy of the final norm, ColumnParallelLinear for the "
        "head (its weight shared with the embedding when cfg.tie_embeddings); rotary_cos_sin with cfg.head_dim.",
        shape="At construction: the embedding, the blocks, the norm and the head, each built from the full model's "
              "one (the head tied when the config ties it). For the local logits: embed, rotary tables for the "
              "sequence, every block, the norm, the head -- the logits left split over the vocabulary."),
    ("tp", "8"): _h(
        "Compute the cross-entropy from vocabulary-sharded logits without gathering them.",
        "The loss needs only two numbers per token over the whole vocabulary -- the normalising sum and the "
        "target's logit -- and both are sums of per-rank parts; shifting by a global maximum keeps exp finite.",
        "dist.ReduceOp.MAX through dlo.parallel.comm.all_reduce (on a detached tensor); reduce_from_region for the "
        "sums so that autograd reaches every rank; torch.gather or a one-hot mask; ignore_index -100.",
        shape="Per token: the maximum over the group; the shifted logits; this rank's part of the sum of "
              "exponentials and of the target logit (nothing where the label is not in its range); both summed "
              "over the group; the per-token loss from them; the mean over the tokens that count."),
    ("tp", "9"): _h(
        "Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank.",
        "Consecutive ranks share a node, and TP talks at every layer, so its groups are contiguous; creating a "
        "group is collective, so every rank takes part in every creation, in the same order.",
        "torch.distributed.new_group(ranks); dist.get_rank, dist.get_world_size; ValueError.",
        shape="First the lists of ranks (refusing a tp that does not divide the world); then one creation per "
              "list on every rank, keeping the group that contains this rank."),
    ("tp", "10"): _h(
        "Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks.",
        "A DP group joins the ranks that hold the same slice of the model, one per TP block, so they are tp "
        "apart; tp x dp must be the number of processes.",
        "range with a step, or a reshaped torch.arange; torch.distributed.new_group; ValueError naming the world "
        "size.",
        shape="A check of the sizes against the world, then for each TP position the ranks at that position in "
              "every block; created on every rank like the TP groups."),
    ("tp", "11"): _h(
        "Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.",
        "Ranks of one TP group hold different slices of the same model and must see the same data; the DP "
        "replicas see different data, so that is where gradients and metrics are averaged.",
        "DistributedSampler(num_replicas=dp_size, rank=dp_rank); DataLoader; dlo.parallel.comm.all_reduce over "
        "the DP group with phase='dp' or 'metrics'; group_size.",
        shape="The loader: a sampler indexed by the DP coordinates. The gradients: summed over the DP group and "
              "divided by its size. The metric: both sums over the DP group first, one division at the end."),
    ("tp", "12"): _h(
        "Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; "
        "after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the "
        "backward that matches, so that norms and residual adds run on seq/tp tokens per rank.",
        "Outside the parallel layers the activations are identical on every rank, so each rank can keep only its "
        "contiguous chunk of the sequence; entering a layer needs the whole sequence, leaving it needs a sum of "
        "partials. Like f and g, each region's backward is the adjoint of its forward, and a gradient always has "
        "the shape of the input it belongs to.",
        "torch.autograd.Function; dlo.parallel.comm.all_gather_along and reduce_scatter_along with dim=1 (the "
        "sequence), the group, and phase='forward' or 'backward'.",
        shape="Entering: this rank's chunk in, the whole sequence out; its backward takes a gradient of the whole "
              "sequence that is partial on each rank and returns this chunk's share of the total. Leaving: a "
              "partial whole sequence in, this rank's chunk of the total out; its backward takes this chunk's "
              "gradient and returns the whole sequence's."),
    # context parallelism
    ("context", "merge"): _h(
        "Combine the attention of the same queries over two disjoint key sets into the attention over their union, "
        "with the log-sum-exp of the union, so that ring attention can add one key block at a time.",
        "A softmax over A and B is a weighted mix of the softmaxes over A and over B: each part weighs its share of "
        "the union's denominator, and the union's log-denominator is what the next merge needs. Work with "
        "differences of log-sum-exps only: the exponential of a raw lse overflows at large scores and underflows "
        "to 0 far below zero, while a difference stays in range.",
        "torch.logaddexp (it handles -inf), torch.exp, Tensor.unsqueeze(-1) or indexing with [..., None]; or "
        "torch.maximum with torch.log1p.",
        "First the union's lse, from the two lse, without exponentiating either alone. Then each part's weight per "
        "query: the exponential of its lse minus the union's (between 0 and 1, the two summing to 1). Broadcast "
        "each weight over the head dimension, mix the two outputs, return the mix and the union's lse. An empty "
        "part (lse = -inf) must get a weight of exactly 0, never NaN."),
    ("context", "ring_step"): _h(
        "Fold the K/V block a rank holds at one ring step into the running attention of each of its query chunks: "
        "blocks of earlier keys whole, the block of the same chunk with the causal mask, blocks of later keys "
        "skipped, so that after the whole ring every query has seen exactly the keys it may see.",
        "With a causal mask, a pair of chunks is decided by their numbers alone: an earlier key chunk is entirely "
        "visible, the same chunk is visible up to each query's own position, a later chunk is entirely masked. A "
        "fully masked pair costs nothing if it is skipped, and would give NaN if it were computed (a softmax over "
        "no key). What each visible pair gives is a partial attention, folded into the running one by the merge.",
        "C.block_attention(q, k, v, diagonal=...) for one block's (out, lse); the merge argument (your "
        "merge_partial or C.merge_partial); tensor slicing along dim -2 to cut a chunk; enumerate over q_chunks "
        "and k_chunks.",
        "Cut q, k and v into their chunks (each chunk has the same length, the sequence length over the number "
        "of chunks in the list). For every query chunk and every key chunk, compare the two chunk numbers: skip a "
        "later key chunk; otherwise compute the block's partial attention, masked inside when the numbers are "
        "equal. Put it in that query chunk's slot if the slot is empty, else replace the slot by the merge of the "
        "slot and the block. Return the list of slots."),
    # attention kernels
    ("attention", "backend"): _h(
        "Given what decides it (device, dtype, head_dim, causal flag or explicit mask, dropout, GPU generation), "
        "return the SDPA backends that can run the call, in order of preference, and say why each fused kernel "
        "left out cannot.",
        "Each fused kernel is a specialised program: it exists only for some devices, dtypes, head sizes and masks, "
        "and the same condition can differ between its CPU and its CUDA version. MATH is the textbook computation: "
        "it runs everything, so it is the fallback, never the first choice. Naming the condition that fails is what "
        "lets you fix the call (a bf16 cast, a head_dim padded to a multiple of 8, is_causal instead of a mask).",
        shape="Split on the device first. For each fused kernel, go through its rows of the notebook's table and collect "
        "the conditions this case fails, as sentences; a kernel with none is kept. The answer is the kept kernels in "
        "the table's order of preference, then MATH, and the collected sentences keyed by kernel.",
        tools="torch.nn.attention.SDPBackend (FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH); case.device, case.dtype, "
        "case.head_dim, case.has_mask, case.dropout_p, case.capability (a (major, minor) tuple, compared as a "
        "tuple); torch.nn.attention.sdpa_kernel(backends, set_priority=True) to apply the answer."),
}
