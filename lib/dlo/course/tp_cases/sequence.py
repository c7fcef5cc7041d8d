"""Balise 12 on real peers: the two sequence-parallel regions, on the strided TP groups of 2, on 4 and on a subset of 3.

Each stage of :class:`SPCase` checks one behaviour (the gather's forward, its backward, the reduce-scatter's
forward, its backward, a sequence tp does not divide, the whole SP Llama) and returns None or what is wrong,
named when it is a known mistake. A backward that returns a gradient of the wrong shape makes autograd raise its
own shape error: that error is caught and replaced by what the shapes say (for instance the two backwards
swapped), since a raw autograd message does not tell the student which region is wrong nor why.
"""
import traceback

import torch
import torch.distributed as dist

from dlo.course.tp_cases import TP, close, counted, expect, seeded, sum_hint
from dlo.models.config import TransformerConfig
from dlo.models.llama import Llama, token_batch
from dlo.parallel import comm
from dlo.parallel import tensor as lib

SP_CFG = TransformerConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=12,
                           num_kv_heads=6)  # every split divides by 2 and by 3
CHUNK, HIDDEN = 3, 5  # tokens per rank, hidden size: batch 2, seq 3·tp, hidden 5 -- three different sizes
GATHER, SCATTER = "gather_from_sequence_region", "reduce_scatter_to_sequence_region"


def _agree(problem, group):
    """Every rank of ``group`` learns whether one of them found a problem (so that they stop together and no
    rank waits in a collective its peers skipped)."""
    flag = torch.tensor([0.0 if problem is None else 1.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return (problem or "a peer of this rank found a problem") if flag.item() > 0 else None


def _first_line(exc):
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:150] if str(exc).strip() else ''}"


def _counts_are(op, phase, what):
    """None when exactly one ``op`` ran in ``phase`` and nothing else; else what ran instead, named."""
    if comm.COUNTER.calls(op, phase) == 1 and comm.COUNTER.calls() == 1:
        return None
    if comm.COUNTER.calls("all_reduce"):
        other = "reduce_scatter_along" if op == "reduce_scatter" else "all_gather_along"
        return (f"{what}: counted {counted()} -- an all-reduce of the whole tensor then a chunk gives the right "
                f"numbers but moves tp x more than needed and keeps the full tensor: use {other} (phase='{phase}')")
    return f"{what}: expected exactly one {op} (phase='{phase}'), counted {counted()}"


def _backward_shape_problem(name, exc, got_tokens, want_tokens, tp):
    """What a wrong-shaped gradient returned by ``name``'s backward means, from the collectives it ran or that
    refused the shape (autograd rejects the gradient with a shape error before anything else can be looked at)."""
    group_note = _group_note(_first_line(exc), tp)
    if group_note:
        return f"{name} backward: {_first_line(exc)}{group_note}"
    ran = {op for (op, phase) in comm.COUNTER.summary() if phase == "backward"}
    frames = {f.name for f in traceback.extract_tb(exc.__traceback__)}
    ran |= {op for op, fn in (("all_gather", "all_gather_along"), ("reduce_scatter", "reduce_scatter_along"))
            if fn in frames}
    right = {GATHER: "reduce_scatter", SCATTER: "all_gather"}[name]
    wrong = {"all_gather", "reduce_scatter"} - {right}
    if wrong & ran and right not in ran:
        op = next(iter(wrong)).replace("_", "-")
        return (f"{name} backward ran {'an' if op[0] == 'a' else 'a'} {op}, the collective of the other region's "
                "backward (swapped backwards): the gradient of a region has the shape of that region's input "
                f"({want_tokens} tokens along dim 1 here, not {got_tokens})")
    why = ("the input covered the whole sequence, so its gradient must cover it too: all-gather the ranks' chunks"
           if name == SCATTER else "the input was this rank's chunk: sum the ranks' gradients and keep this chunk "
           "(reduce-scatter)")
    return (f"{name} backward returned a gradient that is not the shape of the region's input ({want_tokens} tokens "
            f"along dim 1 at tp={tp}): {why}")


class SPCase:
    """The checks of balise 12 on one TP group of ``tp`` ranks (this rank is ``r``), in :meth:`stages` order."""

    def __init__(self, ns, group, tp, r):
        self.gather, self.scatter = ns[GATHER], ns[SCATTER]
        self.group, self.tp, self.r = group, tp, r
        self.chunk = slice(r * CHUNK, (r + 1) * CHUNK)

    def stages(self):
        return [self.gather_forward, self.gather_backward, self.scatter_forward, self.scatter_backward,
                self.not_divisible, self.whole_model]

    def gather_forward(self):
        tp, r = self.tp, self.r
        parts = [seeded(2, CHUNK, HIDDEN, seed=100 + k) for k in range(tp)]
        self.x = parts[r].clone().requires_grad_()
        comm.COUNTER.reset()
        self.y = y = self.gather(self.x, self.group)
        want = torch.cat(parts, dim=1)
        shape, name = tuple(y.shape), f"{GATHER} forward"
        if shape == (2, CHUNK, HIDDEN * tp):
            return f"{name} gathered along the last dim (hidden): gather along the sequence, dim 1"
        if shape == (2 * tp, CHUNK, HIDDEN):
            return f"{name} gathered along the batch (dim 0): gather along the sequence, dim 1"
        if shape == (2, CHUNK * 4, HIDDEN) and tp == 2:
            return f"{name} gathered the tokens of every rank (4), not of the TP group: pass the group"
        if shape != tuple(want.shape):
            return f"{name}: shape {shape}, expected {tuple(want.shape)} (the ranks' chunks of the sequence, dim 1)"
        if not close(y, want):
            order = [next((k for k in range(tp) if close(c, parts[k])), None) for c in y.detach().split(CHUNK, dim=1)]
            if sorted(o for o in order if o is not None) == list(range(tp)):
                return (f"{name}: the chunks are not in rank order (got ranks {order}): rank k's tokens go to "
                        "positions [k*s/tp, (k+1)*s/tp)")
            return f"{name}: values differ from the ranks' chunks concatenated along dim 1"
        return _counts_are("all_gather", "forward", name)

    def gather_backward(self):
        tp, r, name = self.tp, self.r, f"{GATHER} backward"
        ws = [seeded(2, CHUNK * tp, HIDDEN, seed=200 + k) for k in range(tp)]  # a different upstream on each rank
        comm.COUNTER.reset()
        try:
            (self.y * ws[r]).sum().backward()
        except (RuntimeError, ValueError) as exc:
            return _backward_shape_problem(GATHER, exc, CHUNK * tp * tp, CHUNK, tp)
        want, got = sum(w[:, self.chunk] for w in ws), self.x.grad
        if got is None or got.shape != want.shape:
            return f"{name}: gradient of shape {None if got is None else tuple(got.shape)}, expected {tuple(want.shape)}"
        if not close(got, want):
            if close(got, ws[r][:, self.chunk]):
                return (f"{name} keeps this rank's chunk of its own gradient: each rank's gradient of the gathered "
                        "tensor is a partial sum, so sum them over the group and keep this rank's chunk (reduce-scatter)")
            return f"{name}: wrong gradient of this rank's tokens" + sum_hint(got, want)
        return _counts_are("reduce_scatter", "backward", name)

    def scatter_forward(self):
        tp, r, name = self.tp, self.r, f"{SCATTER} forward"
        parts = [seeded(2, CHUNK * tp, HIDDEN, seed=300 + k) for k in range(tp)]
        self.xp = parts[r].clone().requires_grad_()
        comm.COUNTER.reset()
        self.z = z = self.scatter(self.xp, self.group)
        total = sum(parts)
        want = total[:, self.chunk]
        if tuple(z.shape) == tuple(total.shape) and close(z, total):
            return (f"{name} returns the whole sum: keep only this rank's chunk of the sequence (a reduce-scatter, "
                    "not an all-reduce)")
        if tuple(z.shape) != tuple(want.shape):
            return f"{name}: shape {tuple(z.shape)}, expected {tuple(want.shape)} (this rank's seq/tp tokens, dim 1)"
        if not close(z, want):
            return self._which_chunk(name, z, total, parts[r], want)
        return _counts_are("reduce_scatter", "forward", name)

    def _which_chunk(self, name, z, total, mine, want):
        tp, r = self.tp, self.r
        other = next((k for k in range(tp) if k != r and close(z, total[:, k * CHUNK:(k + 1) * CHUNK])), None)
        if other is not None:
            return (f"{name}: rank {r} of the group got the tokens of chunk {other}: rank r keeps chunk r, "
                    "[r*s/tp, (r+1)*s/tp) (its rank in the group)")
        if close(z, total[:, r::tp]):
            return (f"{name}: rank {r} kept one token in {tp} (a strided split): keep the contiguous chunk "
                    "[r*s/tp, (r+1)*s/tp), the order in which the all-gather puts the chunks back")
        if close(z, mine[:, self.chunk]):
            return f"{name} keeps this rank's chunk of its own partial output: sum over the group first"
        return f"{name}: values differ from the sum's chunk" + sum_hint(z, want)

    def scatter_backward(self):
        tp, r, name = self.tp, self.r, f"{SCATTER} backward"
        gs = [seeded(2, CHUNK, HIDDEN, seed=400 + k) for k in range(tp)]
        comm.COUNTER.reset()
        try:
            (self.z * gs[r]).sum().backward()
        except (RuntimeError, ValueError) as exc:
            return _backward_shape_problem(SCATTER, exc, f"{CHUNK}/{tp}", CHUNK * tp, tp)
        want, got = torch.cat(gs, dim=1), self.xp.grad
        if not close(got, want):
            return f"{name}: wrong gradient: every rank's chunk of the gradient, gathered along dim 1 in rank order"
        return _counts_are("all_gather", "backward", name)

    def not_divisible(self):
        tp = self.tp
        xs = seeded(2, CHUNK * tp + 1, HIDDEN, seed=500)
        try:
            z = self.scatter(xs, self.group)
        except ValueError:
            return None
        return (f"{SCATTER} of {CHUNK * tp + 1} tokens over {tp} ranks returned shape {tuple(z.shape)}: tp must "
                "divide the sequence -- raise a ValueError (reduce_scatter_along does)")

    def whole_model(self):
        group, what = self.group, "TPLlama(sequence_parallel=True) with your regions"
        ids, labels = token_batch(2, 12, SP_CFG.vocab_size, seed=4)
        ref = Llama(SP_CFG, seed=0)
        ref_loss = ref.loss(ids, labels)
        ref_loss.backward()
        model = lib.TPLlama(Llama(SP_CFG, seed=0), group, sequence_parallel=True)
        comm.COUNTER.reset()
        with lib.sequence_regions(self.gather, self.scatter):
            loss = model.loss(ids, labels)
            loss.backward()
        if comm.COUNTER.calls("all_reduce", "backward") or comm.COUNTER.calls("all_reduce", "forward") != 1:
            return f"{what}: counted {counted()}: no activation all-reduce"
        lib.reduce_sequence_parallel_grads(model, group)
        grads = lib.full_tensors(model, group, grads=True)
        if abs(float(loss) - float(ref_loss)) > 1e-5:
            return f"{what}: loss {float(loss):.6f} != {float(ref_loss):.6f}"
        bad = [n for n, p in ref.named_parameters() if not close(grads[n], p.grad)]
        return f"{what}: gradients of {bad[:3]} differ" if bad else None


def _run_stage(stage, tp):
    """One stage's problem (None if none): an unexpected error becomes its first line, with the group named when
    the collective ran over every process."""
    try:
        return stage()
    except NotImplementedError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        found = f"{stage.__name__}: {_first_line(exc)}"
        return found + _group_note(found, tp)


def _group_note(line, tp):
    """Why a collective of the regions ran over every process, when the error says so."""
    world = dist.get_world_size()
    if f"over {world} ranks" not in line:
        return ""
    return (f" -- {world} ranks is every process, not the TP group of {tp}: pass the group to every collective "
            "(ctx.group in the backward)")


def check_12(ns, g):
    """At tp = 2 on the strided TP groups, then tp = 4 (the regions only: the SP Llama's heads do not split in 4),
    then tp = 3 on the subset {0, 2, 3} (rank 1 only joins the verdict)."""
    for tp, group, r in ((TP, g["tp_group"], g["tp_rank"]), (4, g["tp4_group"], g["rank"]),
                         (3, g["tp3_group"], g["tp3_rank"])):
        problem = None
        if r is not None:
            case = SPCase(ns, group, tp, r)
            for stage in case.stages()[:-1] if tp == 4 else case.stages():
                problem = _agree(_run_stage(stage, tp), group)
                if problem:
                    break
        expect(problem is None, f"tp={tp}: {problem}")
