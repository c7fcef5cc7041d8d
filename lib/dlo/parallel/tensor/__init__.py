"""Megatron-style tensor parallelism of :class:`dlo.models.llama.Llama`, from scratch, plus DTensor's version.

Each rank of a tensor-parallel (TP) group of ``tp`` processes holds a *slice* of every big matrix:

* :class:`ColumnParallelLinear` splits the **output** features (rows of ``weight``): every rank needs the
  whole input (``copy_to_region`` "f" before it) and produces its slice of the output;
* :class:`RowParallelLinear` splits the **input** features (columns of ``weight``): it takes the slice a
  column-parallel layer produced and its partial outputs are summed over the ranks (``reduce_from_region``
  "g"); the bias is added once, after the sum;
* :class:`VocabParallelEmbedding` splits the vocabulary: ids outside a rank's range give zeros there, and
  an all-reduce sums the one non-zero row;
* :class:`ParallelSwiGLU` = gate/up column-parallel, down row-parallel: **one** all-reduce per forward;
* :class:`ParallelAttention` gives each rank ``heads/tp`` query heads and ``kv_heads/tp`` K/V heads (GQA
  keeps its grouping inside a rank): again one all-reduce per forward;
* :func:`vocab_parallel_cross_entropy` computes the loss from each rank's slice of the logits, without
  ever gathering the ``[tokens, vocab]`` matrix on one rank.

:class:`TPLlama` is built by *slicing the full weights* of a single-process ``Llama`` (so both start
identical and can be compared exactly) and keeps its parameter names; :func:`full_tensors` gathers its
slices (weights or gradients) back into full tensors. :func:`tp_dp_groups` builds the process groups of
TP × DP (contiguous ranks form a TP group, strided ranks a DP group). :func:`dtensor_llama` parallelises
the same model with ``torch.distributed.tensor.parallel.parallelize_module`` for comparison.

**Sequence parallelism** (Korthikanti et al., 2022; ``sequence_parallel=True`` on the layers, the block and
:class:`TPLlama`): between a row-parallel layer and the next column-parallel one, plain TP keeps the whole
``[batch, seq, hidden]`` activation on every rank and computes the same RMSNorm and residual add ``tp`` times.
SP cuts those regions along the sequence: each rank holds ``seq/tp`` tokens there. The all-reduce "g" after
a row-parallel layer becomes a reduce-scatter along the sequence (:func:`reduce_scatter_to_sequence_region`),
the "f" before a column-parallel layer an all-gather along the sequence
(:func:`gather_from_sequence_region`); the embedding's all-reduce becomes a reduce-scatter and the LM head
gathers the sequence first. Same bytes on the wire (an all-reduce *is* a reduce-scatter then an all-gather),
``1/tp`` of the norms' activations per rank. The norms' weights are replicated but each rank now sees only
its tokens: their gradients are partial sums, added over the group by :func:`reduce_sequence_parallel_grads`
after the backward (what Megatron-LM does for its sequence-parallel parameters).

Its modules: ``regions`` (the sequence-parallel f and g), ``layers`` (the parallel layers and :class:`TPLlama`),
``gather`` (full tensors back, the communication theory), ``activation_memory`` (what sequence parallelism saves),
``groups`` (TP x DP process groups) and ``dtensor`` (PyTorch's version).
"""
from __future__ import annotations

from .regions import (
    gather_from_sequence_region, reduce_scatter_to_sequence_region, sequence_regions,
)
from .layers import (
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, ParallelSwiGLU, ParallelAttention,
    TPDecoderBlock, TPLlama, vocab_parallel_cross_entropy,
)
from .gather import (
    reduce_sequence_parallel_grads, gather_split, full_tensors, comm_theory,
)
from .activation_memory import (
    saved_bytes_inside, norm_saved_bytes_theory, sp_memory_sentence, sp_comm_sentence,
)
from .groups import (
    tp_group_ranks, dp_group_ranks, tp_dp_groups, all_reduce_gradients,
)
from .dtensor import (
    dtensor_llama, dtensor_full_tensors,
)

__all__ = ["gather_from_sequence_region", "reduce_scatter_to_sequence_region", "reduce_sequence_parallel_grads",
           "sequence_regions",
           "saved_bytes_inside", "norm_saved_bytes_theory", "sp_memory_sentence", "sp_comm_sentence",
           "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "ParallelSwiGLU",
           "ParallelAttention", "TPDecoderBlock", "TPLlama", "vocab_parallel_cross_entropy", "gather_split",
           "full_tensors", "comm_theory", "tp_group_ranks", "dp_group_ranks", "tp_dp_groups",
           "all_reduce_gradients", "dtensor_llama", "dtensor_full_tensors"]
