"""Goals and hints of the tensor-parallel workshop (tensor_parallel, context_parallel, attention): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # tensor parallel
    ("tp", "1"): _h(
        "Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, "
        "gather, scatter), as the class docstring describes.",
        "Each primitive is an autograd function whose backward is the 'opposite' collective: identity <-> "
        "all-reduce, all-gather <-> keep one's slice.",
        "torch.autograd.Function, dlo.parallel.comm.all_reduce / all_gather with the group and a phase."),
    ("tp", "2"): _h(
        "Split a linear layer by output features across the TP group (column parallel).",
        "Each rank keeps a slice of the weight's rows (and bias); the input's gradient must be summed over ranks.",
        "A cloned slice as nn.Parameter, copy_to_region on the input, optional gather_from_region on the output."),
    ("tp", "3"): _h(
        "Split a linear layer by input features across the TP group (row parallel).",
        "Each rank computes a partial output from its slice of the input; the partials are summed, the bias is "
        "added once.",
        "A slice of the weight's columns, reduce_from_region, bias after the reduction."),
    ("tp", "4"): _h(
        "Split the embedding table by vocabulary across the TP group.",
        "A rank only knows its range of ids: the others give zero rows, and the sum over ranks rebuilds the lookup.",
        "A mask of ids outside [start, end), shifted ids, F.embedding, reduce_from_region."),
    ("tp", "5"): _h(
        "Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward.",
        "Gate and up projections are column parallel, the down projection row parallel, so the hidden activations "
        "never need communicating.",
        "Your ColumnParallelLinear (with copy_input=False) and RowParallelLinear; copy_to_region once."),
    ("tp", "6"): _h(
        "Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not "
        "divide the heads.",
        "Each rank takes num_heads / tp query heads and num_kv_heads / tp K/V heads; the width of a rank's heads "
        "is heads x head_dim, which need not equal hidden / tp.",
        "Column-parallel q, k, v, row-parallel o; ValueError when tp does not divide the heads or K/V heads."),
    ("tp", "7"): _h(
        "Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names.",
        "Swap each layer for its parallel version in place; the logits and gradients must equal the single-process "
        "model's.",
        "Your VocabParallelEmbedding, ParallelAttention, ParallelSwiGLU and a column-parallel head."),
    ("tp", "8"): _h(
        "Compute the cross-entropy from vocabulary-sharded logits without gathering them.",
        "Log-sum-exp needs the global max and sum, and the target logit lives on one rank: three small reductions.",
        "reduce_from_region (so autograd reaches every rank) for the max-shifted sum of exponentials and the "
        "target logit; ignore_index -100."),
    ("tp", "9"): _h(
        "Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank.",
        "new_group is collective: all ranks must create every group, in the same order, and keep their own.",
        "torch.distributed.new_group(ranks) in a loop; ValueError when tp does not divide the world size."),
    ("tp", "10"): _h(
        "Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks.",
        "tp x dp must equal the world size; a DP group takes one rank from each TP block.",
        "Strided lists of ranks, torch.distributed.new_group; ValueError naming the world size."),
    ("tp", "11"): _h(
        "Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.",
        "Ranks of one TP group see the same data; the DP group is where data differs and must be averaged.",
        "DistributedSampler(num_replicas=dp_size, rank=dp_rank), all_reduce over the DP group."),
    ("tp", "12"): _h(
        "Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; "
        "after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the "
        "backward that matches, so that norms and residual adds run on seq/tp tokens per rank.",
        "The sequence is split in tp contiguous chunks, rank r owning chunk r; the two regions are conjugate like f "
        "and g: the gradient of a gather is a sum over the ranks kept per chunk, the gradient of a reduce-scatter is "
        "gathered back. An all-reduce followed by a slice gives the same numbers but moves and keeps more.",
        "torch.autograd.Function; dlo.parallel.comm.all_gather_along and reduce_scatter_along with dim=1 (the "
        "sequence), the group, and phase='forward' or 'backward'."),
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
