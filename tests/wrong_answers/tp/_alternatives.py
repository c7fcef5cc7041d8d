"""Correct alternatives of the tp balises, written another way than the reference solution, all in one script:
each tests/wrong_answers/tp/<n>/ok_*.py takes its balise from here. One script means one 4-process check run
for all of them (the tp checker caches its run per script), and it also checks that the alternatives work
together (balises 5 and 6 built on the alternative linear layers, 7 on the alternative embedding...).
Not an answer itself (it sits outside the step folders)."""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


# --- balise 1: Correct, written another way: f's forward returns a clone instead of a view, and the gather's
# backward picks this rank's slice with chunk instead of split_last_dim.
class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, phase="backward"), None


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_last_dim(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        mine = grad.chunk(group_size(ctx.group), dim=-1)[group_rank(ctx.group)]
        return mine.contiguous(), None


def copy_to_region(x, group=None):
    return CopyToRegion.apply(x, group)


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)


# --- balise 2: Correct, written another way: the rows are taken with torch.chunk, and the output gathered through
# the gather_from_region primitive only when asked.
_ReferenceColumn = ColumnParallelLinear  # a subclass, so that the given split_dims knows it


class ColumnParallelLinear(_ReferenceColumn):
    def __init__(self, full, group=None, *, gather_output=False, copy_input=True):
        nn.Module.__init__(self)
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp, r = group_size(group), group_rank(group)
        self.weight = nn.Parameter(full.weight.detach().chunk(tp, dim=0)[r].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().chunk(tp)[r].clone())

    def forward(self, x):
        inp = copy_to_region(x, self.group) if self.copy_input else x
        out = inp @ self.weight.t()
        if self.bias is not None:
            out = out + self.bias
        if not self.gather_output:
            return out
        return gather_from_region(out, self.group)


# --- balise 3: Correct, written another way: the partial product with a matmul, the bias added after the sum, the
# columns taken with narrow.
_ReferenceRow = RowParallelLinear  # a subclass, so that the given split_dims knows it


class RowParallelLinear(_ReferenceRow):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.group = group
        tp, r = group_size(group), group_rank(group)
        n = full.in_features // tp
        self.weight = nn.Parameter(full.weight.detach().narrow(1, r * n, n).clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        total = reduce_from_region(torch.matmul(x, self.weight.t()), self.group)
        if self.bias is not None:
            total = total + self.bias
        return total


# --- balise 4: Correct, written another way: the out-of-range ids are clamped into the local table and their rows
# multiplied by a 0/1 mask instead of masked_fill.
_ReferenceEmbedding = VocabParallelEmbedding


class VocabParallelEmbedding(_ReferenceEmbedding):
    def forward(self, ids):
        n = self.vocab_end - self.vocab_start
        inside = (ids >= self.vocab_start) & (ids < self.vocab_end)
        rows = F.embedding((ids - self.vocab_start).clamp(0, n - 1), self.weight)
        return reduce_from_region(rows * inside.unsqueeze(-1).to(rows.dtype), self.group)


# --- balise 5: Correct, written another way: the product of the two branches written the other way round, f applied
# once at the top of forward, the layers built in another order.
class ParallelSwiGLU(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        self.down_proj = RowParallelLinear(full.down_proj, group)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, copy_input=False)
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, copy_input=False)

    def forward(self, x):
        x = copy_to_region(x, self.group)
        up = self.up_proj(x)
        return self.down_proj(up * F.silu(self.gate_proj(x)))


# --- balise 6: Correct, written another way: the heads split with unflatten / flatten instead of view / reshape,
# and the divisibility checked by hand with its own ValueError.
class ParallelAttention(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group, self.head_dim = group, full.head_dim
        tp = group_size(group)
        for what, n in (("num_heads", full.num_heads), ("num_kv_heads", full.num_kv_heads)):
            if n % tp:
                raise ValueError(f"ParallelAttention: tp={tp} does not divide {what}={n}")
        self.num_heads, self.num_kv_heads = full.num_heads // tp, full.num_kv_heads // tp
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False)
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False)
        self.o_proj = RowParallelLinear(full.o_proj, group)

    def forward(self, x, cos, sin):
        x = copy_to_region(x, self.group)
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        return self.o_proj(causal_attention(q, k, v).transpose(1, 2).flatten(2))


# --- balise 7: Correct, written another way: the blocks appended in a loop, the head tied by sharing the Parameter
# object, the rotary tables built once per call from the config.
_ReferenceLlama = TPLlama


class TPLlama(_ReferenceLlama):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.cfg, self.group, self.rope_theta = full.cfg, group, full.rope_theta
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group)
        self.layers = nn.ModuleList()
        for block in full.layers:
            self.layers.append(TPDecoderBlock(block, group))
        self.norm = copy.deepcopy(full.norm)
        self.lm_head = ColumnParallelLinear(full.lm_head, group)
        if full.cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids):
        h = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(input_ids.shape[-1], self.cfg.head_dim, theta=self.rope_theta, device=h.device,
                                  dtype=h.dtype)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.lm_head(self.norm(h))


# --- balise 8: Correct, written another way: the sum of exponentials and the target logit reduced in two calls
# instead of one stacked call, the target picked with a one-hot mask, float64 on the way.
def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    z = local_logits.double()
    n = z.shape[-1]
    start = group_rank(group) * n
    top = all_reduce(z.detach().max(dim=-1).values, group, op=dist.ReduceOp.MAX)
    z = z - top.unsqueeze(-1)
    local = labels - start
    hit = torch.nn.functional.one_hot(local.clamp(0, n - 1), n).to(z.dtype)
    hit = hit * ((local >= 0) & (local < n)).unsqueeze(-1)
    denominator = reduce_from_region(z.exp().sum(dim=-1), group)
    target = reduce_from_region((z * hit).sum(dim=-1), group)
    valid = labels != ignore_index
    per_token = (denominator.log() - target) * valid
    return (per_token.sum() / valid.sum().clamp(min=1)).float()


# --- balise 9: Correct, written another way: the blocks cut out of one list of ranks, every group created first and
# this rank's picked afterwards.
def tp_group_ranks(world_size, tp):
    if tp < 1 or world_size % tp != 0:
        raise ValueError(f"tp={tp} does not divide the {world_size} processes")
    everyone = list(range(world_size))
    return [everyone[start:start + tp] for start in range(0, world_size, tp)]


def make_tp_group(tp):
    made = [(ranks, dist.new_group(ranks)) for ranks in tp_group_ranks(dist.get_world_size(), tp)]
    return next(group for ranks, group in made if dist.get_rank() in ranks)


# --- balise 10: Correct, written another way: the DP groups read as the columns of the ranks laid out dp x tp.
def dp_group_ranks(world_size, tp, dp):
    if tp * dp != world_size:
        raise ValueError(f"tp x dp = {tp * dp} must equal the world size {world_size}")
    return torch.arange(world_size).view(dp, tp).t().tolist()


def make_dp_group(tp, dp):
    mine = None
    for ranks in dp_group_ranks(dist.get_world_size(), tp, dp):
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


# --- balise 11: Correct, written another way: one all-reduce per gradient instead of one on the flattened
# gradients, the division done in place, and the metric's two sums reduced separately.
def dp_loader(dataset, dp_rank, dp_size, batch_per_replica, *, seed=0):
    sampler = DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_per_replica, sampler=sampler, drop_last=True)
    return loader, sampler


def average_gradients(model, dp_group):
    n = group_size(dp_group)
    for p in model.parameters():
        if p.grad is not None and n > 1:
            p.grad.copy_(all_reduce(p.grad, dp_group, phase="dp"))
            p.grad.div_(n)


def reduce_over_dp(loss_sum, count, dp_group):
    total = all_reduce(loss_sum.double(), dp_group, phase="metrics")
    seen = all_reduce(count.double(), dp_group, phase="metrics")
    return float(total / seen)


# --- balise 12: Correct, written another way: the sequence named by its negative index (dim=-2 of [batch, seq,
# hidden]) and the group read back from ctx in a local name.
class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, group, dim=-2, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        return reduce_scatter_along(grad, group, dim=-2, phase="backward"), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x, group, dim=-2, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        return all_gather_along(grad, group, dim=-2, phase="backward"), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
