"""A second set of correct alternatives of the tp balises, each written another way than the reference solution and
than ``_alternatives.py``, all in one script (one 4-process check run for all of them): each
tests/wrong_answers/tp/<n>/ok_*_b.py takes its balise from here. Not an answer itself (it sits outside the step
folders)."""
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


# --- balise 1: the slices taken with chunk and narrow, the sums made contiguous first.
class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.contiguous(), group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.width = group, x.shape[-1]
        return all_gather_last_dim(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        start = group_rank(ctx.group) * ctx.width
        return grad.narrow(-1, start, ctx.width).contiguous(), None


class ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.chunk(group_size(group), dim=-1)[group_rank(group)].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last_dim(grad.contiguous(), ctx.group, phase="backward"), None


def reduce_from_region(x, group=None):
    return ReduceFromRegion.apply(x, group)


def gather_from_region(x, group=None):
    return GatherFromRegion.apply(x, group)


def scatter_to_region(x, group=None):
    return ScatterToRegion.apply(x, group)


# --- balise 2: the rows taken with narrow, the product written with matmul and the bias added apart.
_ReferenceColumn = ColumnParallelLinear


class ColumnParallelLinear(_ReferenceColumn):
    def __init__(self, full, group=None, *, gather_output=False, copy_input=True):
        nn.Module.__init__(self)
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        tp, r = group_size(group), group_rank(group)
        n = full.out_features // tp
        self.weight = nn.Parameter(full.weight.detach().narrow(0, r * n, n).clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().narrow(0, r * n, n).clone())

    def forward(self, x):
        if self.copy_input:
            x = copy_to_region(x, self.group)
        out = torch.matmul(x, self.weight.t())
        if self.bias is not None:
            out = out + self.bias
        return gather_from_region(out, self.group) if self.gather_output else out


# --- balise 3: the columns taken with split, the bias added with torch.add after the sum.
_ReferenceRow = RowParallelLinear


class RowParallelLinear(_ReferenceRow):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.group = group
        tp, r = group_size(group), group_rank(group)
        self.weight = nn.Parameter(full.weight.detach().split(full.in_features // tp, dim=1)[r].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        total = reduce_from_region(F.linear(x, self.weight), self.group)
        return total if self.bias is None else torch.add(total, self.bias)


# --- balise 4: which rank owns an id found by integer division, the rows of other ranks zeroed by torch.where.
_ReferenceEmbedding = VocabParallelEmbedding


class VocabParallelEmbedding(_ReferenceEmbedding):
    def forward(self, ids):
        n = self.weight.shape[0]
        mine = torch.div(ids, n, rounding_mode="floor") == self.vocab_start // n
        rows = F.embedding(torch.where(mine, ids - self.vocab_start, torch.zeros_like(ids)), self.weight)
        return reduce_from_region(torch.where(mine.unsqueeze(-1), rows, torch.zeros_like(rows)), self.group)


# --- balise 5: the activation kept as a module without parameters, the branches named.
class ParallelSwiGLU(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group = group
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, copy_input=False)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, copy_input=False)
        self.down_proj = RowParallelLinear(full.down_proj, group)
        self.act = nn.SiLU()

    def forward(self, x):
        shared = copy_to_region(x, self.group)
        gate, up = self.act(self.gate_proj(shared)), self.up_proj(shared)
        return self.down_proj(gate * up)


# --- balise 6: the local head counts inferred by reshape(-1), the check on both counts in one loop.
class ParallelAttention(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.group, self.head_dim = group, full.head_dim
        tp = group_size(group)
        for name in ("num_heads", "num_kv_heads"):
            _divisible(name, getattr(full, name), tp, "ParallelAttention")
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False)
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False)
        self.o_proj = RowParallelLinear(full.o_proj, group)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        x = copy_to_region(x, self.group)
        heads = [proj(x).reshape(b, s, -1, self.head_dim).transpose(1, 2)
                 for proj in (self.q_proj, self.k_proj, self.v_proj)]
        q, k = apply_rotary(heads[0], heads[1], cos, sin)
        out = causal_attention(q, k, heads[2])
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


# --- balise 7: the blocks built in a list comprehension, the rotary tables sized from the query projection.
_ReferenceLlama = TPLlama


class TPLlama(_ReferenceLlama):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.cfg, self.group, self.rope_theta = full.cfg, group, full.rope_theta
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group)
        self.layers = nn.ModuleList([TPDecoderBlock(block, group) for block in full.layers])
        self.norm = copy.deepcopy(full.norm)
        self.lm_head = ColumnParallelLinear(full.lm_head, group)
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids):
        h = self.embed_tokens(input_ids)
        head_dim = self.layers[0].self_attn.head_dim if len(self.layers) else self.cfg.head_dim
        cos, sin = rotary_cos_sin(input_ids.shape[1], head_dim, theta=self.rope_theta, device=h.device, dtype=h.dtype)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.lm_head(self.norm(h))


# --- balise 8: each rank's log-sum-exp first, combined over the group (its max all-reduced with MAX), in float32.
def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    z = local_logits.float()
    n = z.shape[-1]
    start = group_rank(group) * n
    local_lse = torch.logsumexp(z, dim=-1)
    top = all_reduce(local_lse.detach(), group, op=dist.ReduceOp.MAX)
    lse = reduce_from_region((local_lse - top).exp(), group).log() + top
    own = (labels >= start) & (labels < start + n)
    picked = z.gather(-1, (labels - start).clamp(0, n - 1).unsqueeze(-1)).squeeze(-1)
    target = reduce_from_region(torch.where(own, picked, torch.zeros_like(picked)), group)
    valid = (labels != ignore_index).to(z.dtype)
    return ((lse - target) * valid).sum() / valid.sum().clamp(min=1)


# --- balise 9: the groups from integer division of the ranks, all made before this rank's is picked by index.
def tp_group_ranks(world_size, tp):
    if tp <= 0 or world_size % tp:
        raise ValueError(f"{world_size} processes cannot be cut into TP groups of {tp}")
    groups = [[] for _ in range(world_size // tp)]
    for rank in range(world_size):
        groups[rank // tp].append(rank)
    return groups


def make_tp_group(tp):
    made = [dist.new_group(ranks) for ranks in tp_group_ranks(dist.get_world_size(), tp)]
    return made[dist.get_rank() // tp]


# --- balise 10: the DP groups written as "the i-th rank of every TP group".
def dp_group_ranks(world_size, tp, dp):
    if tp * dp != world_size:
        raise ValueError(f"tp × dp must equal the world size ({tp} × {dp} != {world_size})")
    return [[block * tp + i for block in range(dp)] for i in range(tp)]


def make_dp_group(tp, dp):
    made = [dist.new_group(ranks) for ranks in dp_group_ranks(dist.get_world_size(), tp, dp)]
    return made[dist.get_rank() % tp]


# --- balise 11: the gradients flattened with torch's helpers, the mean as a product; the metric's sums in float64.
def dp_loader(dataset, dp_rank, dp_size, batch_per_replica, *, seed=0):
    sampler = DistributedSampler(dataset, dp_size, dp_rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_per_replica, sampler=sampler, drop_last=True), sampler


def average_gradients(model, dp_group):
    n = group_size(dp_group)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if n == 1 or not grads:
        return
    flat = all_reduce(torch._utils._flatten_dense_tensors(grads), dp_group, phase="dp") * (1.0 / n)
    for grad, mean in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        grad.copy_(mean)


def reduce_over_dp(loss_sum, count, dp_group):
    sums = all_reduce(torch.tensor([float(loss_sum), float(count)], dtype=torch.float64), dp_group, phase="metrics")
    return sums[0].item() / sums[1].item()


# --- balise 12: the sequence moved to dim 0 (transpose), gathered and reduce-scattered along it, moved back.
class GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x.transpose(0, 1), group, dim=0, phase="forward").transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, grad):
        out = reduce_scatter_along(grad.transpose(0, 1), ctx.group, dim=0, phase="backward")
        return out.transpose(0, 1).contiguous(), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along(x.transpose(0, 1), group, dim=0, phase="forward").transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, grad):
        out = all_gather_along(grad.transpose(0, 1), ctx.group, dim=0, phase="backward")
        return out.transpose(0, 1).contiguous(), None


def gather_from_sequence_region(x, group=None):
    return GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return ReduceScatterToSequenceRegion.apply(x, group)
