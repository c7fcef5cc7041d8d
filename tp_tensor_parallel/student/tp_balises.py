# Exercise version: generated from ../tp_balises.py by `make student` -- edit this copy.
# The parts marked TODO raise NotImplementedError until you write them; `dlo check --list` shows their checkers.
"""Workshop -- Megatron-style tensor parallelism (TP) of a Llama decoder, from scratch, in 12 balises.

Tensor parallelism cuts every large weight matrix of the model into ``tp`` slices, one per process of a
*TP group*: each process stores and multiplies only its slice, and the processes exchange activations
(all-reduces) at a few well-chosen places. The model is :class:`dlo.models.llama.Llama` (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU MLP); every parallel piece below is built by *slicing the
weights of the full model*, so the TP model must reproduce the single-process model exactly.

Run it:
    python tp_balises.py                                     # 1 process (tp = 1): the reference
    torchrun --nproc_per_node 2 tp_balises.py --layouts 2x1  # tp = 2 (gloo on CPU, nccl on GPUs)
    torchrun --nproc_per_node 4 tp_balises.py --layouts 4x1 2x2 --impls scratch dtensor
    torchrun --nproc_per_node 2 tp_balises.py --sp             # plain TP vs sequence parallelism (balise 12)
    dlo.runtime.launch("tp_balises.py", [...], nproc=4)         # what the notebook does (srun under Slurm)

Balises 1-12 below are yours: in ``student/tp_balises.py`` their bodies raise NotImplementedError until
you write them, and ``dlo check tp <n>`` checks balise n (``dlo check --list`` shows them all). The
communication helpers you call (:func:`dlo.parallel.comm.all_reduce`, ``all_gather_last_dim``,
``split_last_dim``, ``all_gather_along``, ``reduce_scatter_along``) count every collective, so the notebook can
compare your traffic with theory.
"""
from __future__ import annotations

import argparse

from dlo.runtime.arguments import ScriptParser, at_least, parse_for_launch


def layout_arg(text: str) -> str:
    """``type=`` of a TPxDP layout (``2x1``): two integers >= 1."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"a layout is TPxDP with two integers >= 1 (e.g. 2x1), got {text!r}")
    return text


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="tp_balises.py", description=__doc__.splitlines()[0])
    p.add_argument("--layouts", nargs="+", type=layout_arg, default=None,
                   help="TPxDP layouts, e.g. 2x1 2x2 (default: <world>x1)")
    p.add_argument("--impls", nargs="+", default=["scratch"], choices=["scratch", "dtensor"],
                   help="from-scratch TP (this file) and/or DTensor's parallelize_module (dp = 1 only)")
    p.add_argument("--vocab", type=at_least(1), default=512)
    p.add_argument("--hidden", type=at_least(1), default=128)
    p.add_argument("--intermediate", type=at_least(1), default=256)
    p.add_argument("--layers", type=at_least(1), default=2)
    p.add_argument("--heads", type=at_least(1), default=8)
    p.add_argument("--kv-heads", type=at_least(1), default=4)
    p.add_argument("--seq", type=at_least(1), default=64)
    p.add_argument("--global-batch", type=at_least(1), default=8, help="sequences per optimizer step, over the DP replicas")
    p.add_argument("--steps", type=at_least(1), default=8, help="training steps (the first --warmup untimed)")
    p.add_argument("--warmup", type=at_least(0), default=2)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--n-train", type=at_least(1), default=256, help="sequences of the (random-token) training set")
    p.add_argument("--n-val", type=at_least(1), default=32)
    p.add_argument("--gathered-loss", action="store_true", help="gather the logits and use F.cross_entropy")
    p.add_argument("--compare", action="store_true", help="after one step, compare with the single-process model")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--sp", action="store_true", help="instead of training: one step of plain TP and of sequence "
                   "parallelism with your balise 12 (every process in one TP group), counted and measured")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> None:
    """The options checked together and against the launch's process count, before any process group: a ValueError
    in one line for the first that cannot run."""
    if args.hidden % args.heads:
        raise ValueError(f"argument --heads: {args.heads} heads do not divide --hidden {args.hidden}")
    if args.heads % args.kv_heads:
        raise ValueError(f"argument --kv-heads: {args.kv_heads} K/V heads do not divide --heads {args.heads}")
    cuts = {"--heads": args.heads, "--kv-heads": args.kv_heads, "--intermediate": args.intermediate,
            "--vocab": args.vocab}
    if args.sp:  # every process in one TP group, the sequence cut in as many pieces
        cuts["--seq"] = args.seq
        layouts = [f"{world_size}x1"]
    else:
        layouts = args.layouts or [f"{world_size}x1"]
    for layout in layouts:
        tp, dp = (int(v) for v in layout.lower().split("x"))
        if tp * dp != world_size:
            raise ValueError(f"argument --layouts: {layout} needs tp x dp = {tp * dp} processes, this launch has "
                             f"{world_size}")
        for option, n in cuts.items():
            if n % tp:
                raise ValueError(f"argument {option}: tp={tp} (layout {layout}) does not divide {n}")
        if args.global_batch % dp or args.n_val < dp:
            raise ValueError(f"argument --global-batch: {args.global_batch} sequences (and --n-val {args.n_val}) "
                             f"do not split over dp={dp} replicas (layout {layout})")


def checked_args(argv=None) -> argparse.Namespace:
    """The options, refused in one line (exit code 2) when they cannot run on this launch's processes. Every rank
    finds the same mistake and says it: a launcher stops the other ranks at the first that fails."""
    return parse_for_launch(build_parser(), check_args, argv)


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    checked_args()

import copy
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import dlo  # noqa: F401  (project caches and the torchvision shim)
from dlo.measure.bench import PeakMemory
from dlo.runtime import synchronize
from dlo.runtime import init_distributed, teardown, write_record
from dlo.models.llama import Llama, apply_rotary, causal_attention, lm_loss, rotary_cos_sin, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel.comm import (COUNTER, all_gather_along, all_gather_last_dim, all_reduce, group_rank, group_size,
                               reduce_scatter_along, split_last_dim)


# ===================================================================================================
# Balise 1 -- the four autograd-aware communication primitives
# ===================================================================================================
# A torch.autograd.Function has a forward and a backward; ``ctx`` carries what backward needs (the group).
# Use all_reduce(t, group, phase="forward"|"backward"), all_gather_last_dim(t, group, phase=...) and
# split_last_dim(t, group): with one process they return t unchanged, so this file also runs alone.

class CopyToRegion(torch.autograd.Function):
    """"f": the input is already whole on every rank; each rank's layer uses it, so the gradient of the input
    is the SUM of the ranks' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')


class ReduceFromRegion(torch.autograd.Function):
    """"g": each rank holds a partial sum; the forward adds them up; the sum's gradient flows back unchanged
    to every partial (d(a+b)/da = 1)."""

    @staticmethod
    def forward(ctx, x, group):
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')


class GatherFromRegion(torch.autograd.Function):
    """Forward: concatenate the ranks' slices along the last dimension. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')


class ScatterToRegion(torch.autograd.Function):
    """Forward: keep this rank's slice of the last dimension. Backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes.
        # (run `dlo hint tp 1` for a hint)
        raise NotImplementedError('Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, gather, scatter), as each class docstring describes. Run `dlo hint tp 1` for a hint.')


def copy_to_region(x, group=None):
    return CopyToRegion.apply(x, group)


def reduce_from_region(x, group=None):
    return ReduceFromRegion.apply(x, group)


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)


def scatter_to_region(x, group=None):
    return ScatterToRegion.apply(x, group)


def _divisible(what: str, n: int, tp: int, where: str) -> None:
    """One clear error line when tp does not divide a dimension (given: use it in balises 2-7)."""
    if n % tp:
        raise ValueError(f"{where}: tp={tp} does not divide {what}={n}; "
                         f"choose tp among {[d for d in range(1, min(n, 64) + 1) if n % d == 0]}")


# ===================================================================================================
# Balise 2 -- ColumnParallelLinear: split the OUTPUT features
# ===================================================================================================
class ColumnParallelLinear(nn.Module):
    """Rank r of tp keeps rows [r*n, (r+1)*n) of ``full.weight`` (out_features x in_features) and of the bias,
    n = out_features / tp, as its own Parameters ``weight`` / ``bias`` (clones: not views of ``full``).
    Its output is this rank's slice of the output features (all of them, in order, with ``gather_output``), and
    the input's gradient must be the full layer's -- unless ``copy_input=False``, for a caller that already
    takes care of the input's gradient once for several layers."""

    def __init__(self, full: nn.Linear, group=None, *, gather_output: bool = False, copy_input: bool = True) -> None:
        super().__init__()
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp, r = group_size(group), group_rank(group)
        _divisible("out_features", full.out_features, tp, "ColumnParallelLinear")
        # TODO: Split a linear layer by output features across the TP group (column parallel).
        # (run `dlo hint tp 2` for a hint)
        raise NotImplementedError('Split a linear layer by output features across the TP group (column parallel). Run `dlo hint tp 2` for a hint.')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: Split a linear layer by output features across the TP group (column parallel).
        # (run `dlo hint tp 2` for a hint)
        raise NotImplementedError('Split a linear layer by output features across the TP group (column parallel). Run `dlo hint tp 2` for a hint.')


# ===================================================================================================
# Balise 3 -- RowParallelLinear: split the INPUT features
# ===================================================================================================
class RowParallelLinear(nn.Module):
    """Rank r keeps columns [r*n, (r+1)*n) of ``full.weight``, n = in_features / tp; its input is already
    that slice of the features (the output of a ColumnParallelLinear). Partial outputs are summed over the
    ranks by g; the bias (whole, not sliced) is added ONCE, after the sum."""

    def __init__(self, full: nn.Linear, group=None) -> None:
        super().__init__()
        self.group = group
        tp, r = group_size(group), group_rank(group)
        _divisible("in_features", full.in_features, tp, "RowParallelLinear")
        # TODO: Split a linear layer by input features across the TP group (row parallel).
        # (run `dlo hint tp 3` for a hint)
        raise NotImplementedError('Split a linear layer by input features across the TP group (row parallel). Run `dlo hint tp 3` for a hint.')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: Split a linear layer by input features across the TP group (row parallel).
        # (run `dlo hint tp 3` for a hint)
        raise NotImplementedError('Split a linear layer by input features across the TP group (row parallel). Run `dlo hint tp 3` for a hint.')


# ===================================================================================================
# Balise 4 -- VocabParallelEmbedding: split the vocabulary
# ===================================================================================================
class VocabParallelEmbedding(nn.Module):
    """Rank r keeps the rows [r*n, (r+1)*n) of the embedding table (n = vocab / tp). Every rank receives every
    id, but can only answer for those in its range: the output must equal the full table's lookup, with any id
    of the vocabulary (no index out of range on any rank)."""

    def __init__(self, full: nn.Embedding, group=None) -> None:
        super().__init__()
        self.group = group
        tp, r = group_size(group), group_rank(group)
        _divisible("vocab_size", full.num_embeddings, tp, "VocabParallelEmbedding")
        n = full.num_embeddings // tp
        self.vocab_start, self.vocab_end = r * n, (r + 1) * n
        self.weight = nn.Parameter(full.weight.detach()[self.vocab_start:self.vocab_end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # TODO: Split the embedding table by vocabulary across the TP group.
        # (run `dlo hint tp 4` for a hint)
        raise NotImplementedError('Split the embedding table by vocabulary across the TP group. Run `dlo hint tp 4` for a hint.')


# ===================================================================================================
# Balise 5 -- the parallel SwiGLU MLP: one all-reduce per forward
# ===================================================================================================
class ParallelSwiGLU(nn.Module):
    """A :class:`dlo.models.llama.SwiGLU` (``down(silu(gate(x)) * up(x))``) split over the group with your parallel
    layers, so that a forward costs one all-reduce and a backward one (gate and up both read x: its gradient
    must still be summed over the ranks only once)."""

    def __init__(self, full, group=None) -> None:
        super().__init__()
        self.group = group
        _divisible("intermediate_size", full.gate_proj.out_features, group_size(group), "ParallelSwiGLU")
        # TODO: Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward.
        # (run `dlo hint tp 5` for a hint)
        raise NotImplementedError('Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward. Run `dlo hint tp 5` for a hint.')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward.
        # (run `dlo hint tp 5` for a hint)
        raise NotImplementedError('Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward. Run `dlo hint tp 5` for a hint.')


# ===================================================================================================
# Balise 6 -- parallel grouped-query attention: heads split, one all-reduce per forward
# ===================================================================================================
class ParallelAttention(nn.Module):
    """From a :class:`dlo.models.llama.Attention`: rank r owns query heads [r*h/tp, (r+1)*h/tp) and K/V heads
    [r*kv/tp, (r+1)*kv/tp), one all-reduce per forward, the output equal to the full module's. Raise a clear
    ValueError when tp does not divide num_heads or num_kv_heads (use _divisible). Rotary embeddings and
    attention are per head: apply_rotary and causal_attention work unchanged on a rank's heads."""

    def __init__(self, full, group=None) -> None:
        super().__init__()
        self.group, self.head_dim = group, full.head_dim
        tp = group_size(group)
        # TODO: Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not divide the heads.
        # (run `dlo hint tp 6` for a hint)
        raise NotImplementedError('Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not divide the heads. Run `dlo hint tp 6` for a hint.')

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # TODO: Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not divide the heads.
        # (run `dlo hint tp 6` for a hint)
        raise NotImplementedError('Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not divide the heads. Run `dlo hint tp 6` for a hint.')


# ===================================================================================================
# Balise 7 -- the whole TP transformer
# ===================================================================================================
class TPDecoderBlock(nn.Module):
    """Given: the pre-norm block with parallel attention and MLP; the norms are replicated (deep copies)."""

    def __init__(self, full, group=None) -> None:
        super().__init__()
        self.input_layernorm = copy.deepcopy(full.input_layernorm)
        self.self_attn = ParallelAttention(full.self_attn, group)
        self.post_attention_layernorm = copy.deepcopy(full.post_attention_layernorm)
        self.mlp = ParallelSwiGLU(full.mlp, group)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TPLlama(nn.Module):
    """:class:`dlo.models.llama.Llama` split over ``group``, with the SAME parameter names: ``embed_tokens``
    (vocab-parallel), ``layers`` (TPDecoderBlock), ``norm`` (replicated copy), ``lm_head`` (column-parallel,
    output left split over the vocabulary; tied to ``embed_tokens.weight`` when ``cfg.tie_embeddings``)."""

    def __init__(self, full: Llama, group=None) -> None:
        super().__init__()
        self.cfg, self.group, self.rope_theta = full.cfg, group, full.rope_theta
        # TODO: Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names.
        # (run `dlo hint tp 7` for a hint)
        raise NotImplementedError("Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names. Run `dlo hint tp 7` for a hint.")

    def local_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's slice [batch, seq, vocab/tp] of the logits."""
        # TODO: Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names.
        # (run `dlo hint tp 7` for a hint)
        raise NotImplementedError("Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names. Run `dlo hint tp 7` for a hint.")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The full logits (gathered: [batch, seq, vocab] on every rank)."""
        return gather_from_region(self.local_logits(input_ids), self.group)

    def loss(self, input_ids, labels, *, vocab_parallel: bool = True) -> torch.Tensor:
        if vocab_parallel:
            return vocab_parallel_cross_entropy(self.local_logits(input_ids), labels, self.group)
        return lm_loss(self(input_ids), labels)


# ===================================================================================================
# Balise 8 -- vocab-parallel cross-entropy: never build the full logits on one rank
# ===================================================================================================
def vocab_parallel_cross_entropy(local_logits: torch.Tensor, labels: torch.Tensor, group=None, *,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy over the tokens whose label is not ``ignore_index``, equal to F.cross_entropy of
    the full logits, from this rank's slice [..., V/tp] (vocabulary [r*V/tp, (r+1)*V/tp)), without ever
    building the full logits on one rank. It must stay finite for logits in the hundreds (float32), and its
    gradient must reach every rank's logits. Compute in float32."""
    # TODO: Compute the cross-entropy from vocabulary-sharded logits without gathering them.
    # (run `dlo hint tp 8` for a hint)
    raise NotImplementedError('Compute the cross-entropy from vocabulary-sharded logits without gathering them. Run `dlo hint tp 8` for a hint.')


# ===================================================================================================
# Balise 9 -- TP process groups: contiguous ranks
# ===================================================================================================
def tp_group_ranks(world_size: int, tp: int) -> list[list[int]]:
    """The TP groups as lists of ranks: contiguous blocks [[0..tp-1], [tp..2tp-1], ...] (the ranks of one node
    are contiguous, and TP, which communicates at every layer, must stay inside a node). ValueError if tp
    does not divide world_size."""
    # TODO: Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank.
    # (run `dlo hint tp 9` for a hint)
    raise NotImplementedError('Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank. Run `dlo hint tp 9` for a hint.')


def make_tp_group(tp: int):
    """Create EVERY TP group with dist.new_group (every rank must call new_group for every group, in the
    same order, even for groups it is not in) and return this rank's group."""
    # TODO: Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank.
    # (run `dlo hint tp 9` for a hint)
    raise NotImplementedError('Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank. Run `dlo hint tp 9` for a hint.')


# ===================================================================================================
# Balise 10 -- DP groups: strided ranks
# ===================================================================================================
def dp_group_ranks(world_size: int, tp: int, dp: int) -> list[list[int]]:
    """The DP groups: the ranks that hold the SAME TP slice, i.e. strided [[0, tp, 2tp, ...], [1, tp+1, ...]].
    Raise ValueError("tp × dp must equal the world size: ...") when tp * dp != world_size."""
    # TODO: Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks.
    # (run `dlo hint tp 10` for a hint)
    raise NotImplementedError('Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks. Run `dlo hint tp 10` for a hint.')


def make_dp_group(tp: int, dp: int):
    """Create every DP group (same rule as make_tp_group) and return this rank's."""
    # TODO: Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks.
    # (run `dlo hint tp 10` for a hint)
    raise NotImplementedError('Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks. Run `dlo hint tp 10` for a hint.')


# ===================================================================================================
# Balise 11 -- TP x DP: shard the data over DP, average gradients and metrics over DP only
# ===================================================================================================
def dp_loader(dataset, dp_rank: int, dp_size: int, batch_per_replica: int, *, seed: int = 0):
    """(DataLoader, DistributedSampler) giving DP replica ``dp_rank`` its shard. The ranks of one TP group
    must read the SAME batch: the sampler is indexed by the DP rank, not by the global rank."""
    # TODO: Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.
    # (run `dlo hint tp 11` for a hint)
    raise NotImplementedError('Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only. Run `dlo hint tp 11` for a hint.')


def average_gradients(model: nn.Module, dp_group) -> None:
    """Average every gradient over the DP group (what DDP(process_group=dp_group) would do); count the
    collectives with phase="dp". With one DP replica, nothing to do."""
    # TODO: Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.
    # (run `dlo hint tp 11` for a hint)
    raise NotImplementedError('Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only. Run `dlo hint tp 11` for a hint.')


def reduce_over_dp(loss_sum: torch.Tensor, count: torch.Tensor, dp_group) -> float:
    """Validation loss over the whole validation set, from each replica's sum of losses and count of tokens (the
    ranks of a TP group computed the SAME numbers: counted once, not tp times)."""
    # TODO: Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.
    # (run `dlo hint tp 11` for a hint)
    raise NotImplementedError('Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only. Run `dlo hint tp 11` for a hint.')


# ===================================================================================================
# Balise 12 -- sequence parallelism: the norms and residual adds on seq/tp tokens
# ===================================================================================================
# Between a row-parallel layer and the next column-parallel one, TP keeps the WHOLE [batch, seq, hidden]
# activation on every rank, and every rank computes the same RMSNorm and residual add on it. Sequence
# parallelism (SP) gives each rank seq/tp contiguous tokens there (rank r: tokens [r*s/tp, (r+1)*s/tp)), so
# the two regions below replace f and g at the edges of the parallel layers. The collectives of
# dlo.parallel.comm that work along a dimension (dim 1 is the sequence) count their traffic and raise a clear
# ValueError when tp does not divide the sequence.

class GatherFromSequenceRegion(torch.autograd.Function):
    """SP's "f", before a column-parallel layer: the layer needs every token, each rank holds seq/tp of them.
    The gradient that comes back covers the whole sequence and is partial on each rank (each used its slice of
    the weights); what this rank's tokens need is their share of the total."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # TODO: Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank.
        # (run `dlo hint tp 12` for a hint)
        raise NotImplementedError("Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank. Run `dlo hint tp 12` for a hint.")

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank.
        # (run `dlo hint tp 12` for a hint)
        raise NotImplementedError("Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank. Run `dlo hint tp 12` for a hint.")


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    """SP's "g", after a row-parallel layer: the ranks' partial outputs summed, this rank's tokens kept.
    The gradient that comes back covers this rank's tokens only, while its input covered the whole sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # TODO: Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank.
        # (run `dlo hint tp 12` for a hint)
        raise NotImplementedError("Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank. Run `dlo hint tp 12` for a hint.")

    @staticmethod
    def backward(ctx, grad):
        # TODO: Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank.
        # (run `dlo hint tp 12` for a hint)
        raise NotImplementedError("Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the backward that matches, so that norms and residual adds run on seq/tp tokens per rank. Run `dlo hint tp 12` for a hint.")


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)


# ===================================================================================================
# Given: gather a TP model's slices back into full tensors (to compare with the single-process model)
# ===================================================================================================
def split_dims(model: nn.Module) -> dict[str, int | None]:
    """Where each parameter's slice sits in the full tensor (None: replicated)."""
    out: dict[str, int | None] = {}
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            full_name = f"{mod_name}.{p_name}" if mod_name else p_name
            dim = None
            if isinstance(mod, (ColumnParallelLinear, VocabParallelEmbedding)):
                dim = 0
            elif isinstance(mod, RowParallelLinear) and p_name == "weight":
                dim = 1
            out.setdefault(full_name, dim)
    return out


def full_tensors(model: nn.Module, group=None, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """{name: full tensor} of the parameters (or gradients), gathered over the TP group (not counted)."""
    dims, n, out = split_dims(model), group_size(group), {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach().contiguous()
        if dims[name] is None or n == 1:
            out[name] = t.clone()
        else:
            parts = [torch.empty_like(t) for _ in range(n)]
            dist.all_gather(parts, t, group=group)
            out[name] = torch.cat(parts, dim=dims[name])
    return out


# ===================================================================================================
# main: train TP (x DP) models, measure, compare with one process; one record per layout
# ===================================================================================================
def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _dataset(n: int, seq: int, vocab: int, seed: int) -> TensorDataset:
    """Learnable token sequences: each sequence follows t -> (5 t + c) mod vocab from a random start, with
    its own c among 4 values (so the model must read the context to tell which rule applies)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=gen)
    c = torch.tensor([1, 3, 7, 11])[torch.randint(0, 4, (n, 1), generator=gen)]
    tokens = [start]
    for _ in range(seq):
        tokens.append((5 * tokens[-1] + c) % vocab)
    tokens = torch.cat(tokens, dim=1)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def _compare(args, cfg, model, tp_group, dp_group, dp_rank, dp, impl, device) -> dict[str, float]:
    """One step on a fixed global batch, TP(xDP) vs the single-process Llama: largest differences."""
    ids, labels = token_batch(args.global_batch, args.seq, cfg.vocab_size, seed=123)
    ref = Llama(cfg, seed=0).to(device)
    ref_loss = ref.loss(ids.to(device), labels.to(device))
    ref_loss.backward()
    per = args.global_batch // dp
    rows = slice(dp_rank * per, (dp_rank + 1) * per)
    x, y = ids[rows].to(device), labels[rows].to(device)
    loss = model.loss(x, y) if impl == "dtensor" else model.loss(x, y, vocab_parallel=not args.gathered_loss)
    loss.backward()
    if impl == "dtensor":
        from dlo.parallel.tensor import dtensor_full_tensors

        grads = dtensor_full_tensors(model, grads=True)
    else:
        if dp > 1:
            average_gradients(model, dp_group)
        grads = full_tensors(model, tp_group, grads=True)
    loss_all = loss.detach() if dp == 1 else all_reduce(loss.detach(), dp_group, phase="metrics") / dp
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    model.zero_grad(set_to_none=True)
    return {"loss": float((loss_all - ref_loss.detach()).abs()),
            "grad": max(float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads),
            "grad_rel": max(float((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm().clamp(min=1e-30))
                            for n in ref_grads)}


def _loader(dataset, dp_rank: int, dp: int, batch: int):
    """The data of one replica: yours (balise 11) with TP x DP; with one replica, the same sampler, given."""
    if dp > 1:
        return dp_loader(dataset, dp_rank, dp, batch)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True), sampler


def run_layout(args, layout: str, impl: str, ctx, device) -> dict:
    tp, dp = (int(v) for v in layout.lower().split("x"))
    world = dist.get_world_size() if dist.is_initialized() else 1
    if impl == "dtensor" and dp != 1:
        raise ValueError(f"--impls dtensor runs pure TP only (dp = 1); got layout {layout}")
    if dp == 1:  # pure TP: every process in one TP group, one replica; balises 9 to 11 are for TP x DP
        if tp != world:
            raise ValueError(f"layout {layout}: tp × dp must equal the world size {world}")
        tp_group, dp_group = (dist.group.WORLD if dist.is_initialized() else None), None
    else:
        dp_group_ranks(world, tp, dp)  # a clear error before anything else
        tp_group = make_tp_group(tp) if dist.is_initialized() else None
        dp_group = make_dp_group(tp, dp) if dist.is_initialized() else None
    rank = dist.get_rank() if dist.is_initialized() else 0
    tp_rank, dp_rank = rank % tp, rank // tp
    cfg = TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                            num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                            name="workshop Llama")
    dtype = getattr(torch, args.dtype)
    full = Llama(cfg, seed=0).to(device)
    if impl == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh

        from dlo.parallel.tensor import dtensor_llama

        model = dtensor_llama(full, init_device_mesh(device.type, (tp,)))
    else:
        model = TPLlama(full, tp_group)
    del full
    diffs = _compare(args, cfg, model, tp_group, dp_group, dp_rank, dp, impl, device) if args.compare else None
    model = model.to(dtype)
    local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if args.global_batch % dp:
        raise ValueError(f"--global-batch {args.global_batch} is not divisible by dp={dp}")
    loader, sampler = _loader(_dataset(args.n_train, args.seq, cfg.vocab_size, seed=0), dp_rank, dp,
                              args.global_batch // dp)

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    it, times, losses, comm_step = batches(), [], [], None
    with PeakMemory(device) as peak:
        for step in range(args.steps):
            x, y = (t.to(device) for t in next(it))
            synchronize(device)
            if dist.is_initialized():
                dist.barrier()
            COUNTER.reset()
            t0 = time.perf_counter()
            loss = model.loss(x, y) if impl == "dtensor" else model.loss(x, y, vocab_parallel=not args.gathered_loss)
            loss.backward()
            if impl == "scratch" and dp > 1:
                average_gradients(model, dp_group)
            opt.step()
            opt.zero_grad(set_to_none=True)
            synchronize(device)
            times.append(time.perf_counter() - t0)
            if comm_step is None:
                comm_step = COUNTER.rows()
            losses.append(float(loss.detach()))
    # validation: every rank of a TP group sees the same sequences; the DP replicas split them
    val = _dataset(args.n_val, args.seq, cfg.vocab_size, seed=1)
    per = args.n_val // dp
    vx, vy = (t[dp_rank * per:(dp_rank + 1) * per].to(device) for t in val.tensors)
    with torch.no_grad():
        vloss = model.loss(vx, vy) if impl == "dtensor" else model.loss(vx, vy, vocab_parallel=not args.gathered_loss)
    val_loss = float(vloss) if dp == 1 else reduce_over_dp(vloss.detach().float() * vy.numel(),
                                                             torch.tensor(float(vy.numel()), device=device), dp_group)
    timed = times[args.warmup:] or times
    record = {"kind": "layout", "layout": layout, "impl": impl, "tp": tp, "dp": dp, "tp_rank": tp_rank,
              "dp_rank": dp_rank, "device": str(device), "dtype": args.dtype, "step_s_median": statistics.median(timed),
              "step_s": times, "losses": losses, "val_loss": val_loss, "comm": comm_step or [],
              "local_params": local_params, "local_param_bytes": local_params * torch.finfo(dtype).bits // 8,
              "peak_bytes": peak.peak_bytes, "peak_kind": peak.kind,
              "tokens_per_s": args.global_batch * args.seq / statistics.median(timed), "compare": diffs,
              "config": {k: getattr(args, k) for k in ("vocab", "hidden", "intermediate", "layers", "heads", "kv_heads",
                                                       "seq", "global_batch")}}
    if rank == 0:
        print(f"{impl:8s} {layout}: {record['step_s_median'] * 1e3:8.1f} ms/step, loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}, val {val_loss:.3f}" + (f", max |grad diff| {diffs['grad']:.1e}" if diffs else ""),
              flush=True)
    return record


def run_sp(args, device) -> dict:
    """One forward + backward of the library's TPLlama on a fixed batch, every process in one TP group: plain TP,
    then sequence parallelism with YOUR regions (balise 12). For each: the collectives counted, the bytes autograd
    saves inside the RMSNorms on this rank (and their formula), and the largest differences with one process."""
    from dlo.parallel import tensor as lib

    tp = group_size()
    cfg = TransformerConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                            num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                            name="workshop Llama")
    batch = args.global_batch
    ids, labels = (t.to(device) for t in token_batch(batch, args.seq, cfg.vocab_size, seed=123))
    ref = Llama(cfg, seed=0).to(device)
    ref_loss = ref.loss(ids, labels)
    ref_loss.backward()
    record = {"kind": "sp", "tp": tp, "device": str(device), "batch": batch, "seq": args.seq,
              "config": {k: getattr(args, k) for k in ("vocab", "hidden", "intermediate", "layers", "heads",
                                                       "kv_heads", "seq", "global_batch")}}
    for name, sp in (("TP", False), ("SP", True)):
        model = lib.TPLlama(Llama(cfg, seed=0).to(device), sequence_parallel=sp)
        norms = [m for n, m in model.named_modules() if n.endswith("norm")]
        COUNTER.reset()
        with lib.sequence_regions(gather_from_sequence_region, reduce_scatter_to_sequence_region):
            saved = lib.saved_bytes_inside(norms, lambda: model.loss(ids, labels))
            saved["out"].backward()
        comm = COUNTER.rows()
        lib.reduce_sequence_parallel_grads(model)
        grads = lib.full_tensors(model, grads=True)
        record[name] = {
            "comm": comm, "norm_saved_bytes": saved["bytes"],
            "norm_saved_bytes_theory": lib.norm_saved_bytes_theory(cfg.num_layers, batch, args.seq, cfg.hidden_size,
                                                                   tp, sequence_parallel=sp),
            "loss_diff": float((saved["out"].detach() - ref_loss.detach()).abs()),
            "grad_diff": max(float((grads[n] - p.grad).abs().max()) for n, p in ref.named_parameters())}
    if group_rank() == 0:
        print(f"tp={tp}: norms save {record['TP']['norm_saved_bytes'] / 2**10:.1f} KiB per rank with TP, "
              f"{record['SP']['norm_saved_bytes'] / 2**10:.1f} KiB with SP; max |grad diff| "
              f"{max(record[k]['grad_diff'] for k in ('TP', 'SP')):.1e}", flush=True)
    return record


def main(argv=None) -> None:
    args = checked_args(argv)
    ctx = init_distributed()
    device = _device()
    torch.manual_seed(0)
    try:
        if args.sp:
            write_record(run_sp(args, device))
            return
        layouts = args.layouts or [f"{ctx.world_size}x1"]
        for layout in layouts:
            for impl in args.impls:
                if impl == "dtensor" and (not layout.lower().endswith("x1") or not ctx.is_distributed):
                    continue  # DTensor is compared on pure TP, with a process group
                write_record(run_layout(args, layout, impl, ctx, device))
    finally:
        teardown()


if __name__ == "__main__":
    main()
