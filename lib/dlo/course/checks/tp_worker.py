"""Worker started by the ``tp`` checkers: 4 gloo processes import the student's tp_balises.py and check every
balise that needs real peers, in one run (process start-up is the expensive part).

Usage (through dlo.runtime.launch.launch, nproc=4): ``tp_worker.py SCRIPT``. The worker builds its own TP
groups {0,1} {2,3} and DP groups {0,2} {1,3} with ``dist.new_group`` so that balises 1-8 are checked at
tp = 2 whatever balises 9-10 do; any collective that ignores its group (sums over 4 ranks instead of 2)
shows up as a wrong number. Balise 12 (sequence parallelism, rank-dependent chunks) is also checked on a
group of 3 ranks {0, 1, 2} (rank 3 only joins the verdicts), so that a chunk order or a split that only works
for 2 ranks shows. Each rank writes one record ``{"results": {"1": "ok" | "Type: message", ...}}``.
"""
import contextlib
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dlo  # noqa: F401
from dlo.course.exercises import load_exercises
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record
from dlo.models.llama import Attention, Llama, SwiGLU, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel import comm
from dlo.parallel import tensor as lib
from dlo.models.llama import rotary_cos_sin

TP = 2


class Bad(AssertionError):
    pass


def expect(cond, msg):
    """Collective: every rank learns whether ANY rank failed, so that all of them leave the check at the
    same point (a rank leaving early would pair its next collective with its peer's current one)."""
    flag = torch.tensor([0.0 if cond else 1.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        raise Bad(msg if not cond else f"{msg} (seen on another rank)")


def close(a, b, tol=1e-5):
    return a.shape == b.shape and bool((a - b).abs().max() <= tol)


def fail_together():
    """The collective half of a failed ``expect``, for a rank that raised something else (a shape error...):
    its peers, at their next ``expect``, learn that a rank failed instead of pairing with another collective."""
    dist.all_reduce(torch.tensor([1.0]))


def sum_hint(y, want):
    """What a wrong sum of the ranks' partial results looks like, named (tp = 2 groups inside 4 ranks whose
    two TP groups compute the same numbers: a sum over every rank is twice the TP sum)."""
    if y.shape != want.shape or float(want.abs().max()) < 1e-6:
        return ""
    if close(y, 2 * want):
        return (" -- it is exactly twice the expected sum: the all-reduce ran over every rank instead of the "
                "TP group (pass the group), or ran twice")
    if close(y, want / TP):
        return " -- it is the expected sum / tp: the partial results must be summed, not averaged"
    return ""


def counted():
    """The collectives counted since the last reset, in words."""
    rows = comm.COUNTER.summary()
    return ", ".join(f"{v['calls']} {op} ({phase})" for (op, phase), v in rows.items()) or "none"


def seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_1(ns, g):
    r, tpg = g["tp_rank"], g["tp_group"]
    x = seeded(2, 3, 4, seed=10 + r).requires_grad_()  # rank-dependent
    w = seeded(2, 3, 4, seed=20 + r)
    w_all = [seeded(2, 3, 4, seed=20 + k) for k in range(TP)]
    x_all = [seeded(2, 3, 4, seed=10 + k) for k in range(TP)]
    comm.COUNTER.reset()
    y = ns["copy_to_region"](x, tpg)
    expect(torch.equal(y, x), "copy_to_region forward must be the identity")
    (y * w).sum().backward()
    expect(close(x.grad, sum(w_all)), "copy_to_region backward must all-reduce (sum) the gradient over the TP group")
    expect(comm.COUNTER.calls("all_reduce", "backward") == 1 and comm.COUNTER.calls() == 1,
           "copy_to_region: exactly one all-reduce, in backward (use dlo.parallel.comm.all_reduce with phase='backward')")
    x.grad = None
    comm.COUNTER.reset()
    y = ns["reduce_from_region"](x, tpg)
    expect(close(y, sum(x_all)), "reduce_from_region forward must all-reduce (sum) over the TP group"
           + sum_hint(y, sum(x_all)))
    expect(comm.COUNTER.calls("all_reduce", "forward") == 1 and comm.COUNTER.calls() == 1,
           f"reduce_from_region forward: expected exactly one all_reduce (phase='forward'), counted {counted()}")
    comm.COUNTER.reset()
    (y * w).sum().backward()
    expect(close(x.grad, w), "reduce_from_region backward must be the identity (each partial's gradient is the "
                             "sum's gradient, unchanged)")
    expect(comm.COUNTER.calls() == 0, f"reduce_from_region backward is the identity: no collective, counted "
                                      f"{counted()}")
    x.grad = None
    comm.COUNTER.reset()
    y = ns["gather_from_region"](x, tpg)
    expect(close(y, torch.cat(x_all, dim=-1)), "gather_from_region forward: all-gather along the last dim, rank order")
    expect(comm.COUNTER.calls("all_gather", "forward") == 1 and comm.COUNTER.calls() == 1,
           f"gather_from_region forward: expected exactly one all_gather (all_gather_last_dim), counted "
           f"{counted()}")
    comm.COUNTER.reset()
    wg = seeded(2, 3, 4 * TP, seed=30)
    (y * wg).sum().backward()
    expect(close(x.grad, wg[..., r * 4:(r + 1) * 4]), "gather_from_region backward: keep this rank's slice "
           "(every rank already holds the whole gradient: no sum)")
    expect(comm.COUNTER.calls() == 0, f"gather_from_region backward: keep this rank's slice, no collective; counted "
                                      f"{counted()}")
    full = seeded(2, 3, 4 * TP, seed=40).requires_grad_()
    comm.COUNTER.reset()
    y = ns["scatter_to_region"](full, tpg)
    expect(close(y, full.detach()[..., r * 4:(r + 1) * 4]), "scatter_to_region forward: this rank's slice")
    expect(comm.COUNTER.calls() == 0, f"scatter_to_region forward: take this rank's slice, no collective; counted "
                                      f"{counted()}")
    (y * w).sum().backward()
    expect(close(full.grad, torch.cat(w_all, dim=-1)), "scatter_to_region backward: all-gather the gradient")
    expect(comm.COUNTER.calls("all_gather", "backward") == 1 and comm.COUNTER.calls() == 1,
           f"scatter_to_region backward: expected exactly one all_gather (phase='backward'), counted {counted()}")


def _linear_case(ns, g, cls, full, x_full, x_in, kwargs, out_slice):
    layer = ns[cls](full, g["tp_group"], **kwargs)
    column = cls == "ColumnParallelLinear"
    o, i = full.out_features, full.in_features
    want_w, want_b = ((o // TP, i), (o // TP,)) if column else ((o, i // TP), (o,))
    w_shape = tuple(getattr(getattr(layer, "weight", None), "shape", ()))
    b_shape = tuple(getattr(getattr(layer, "bias", None), "shape", ()))
    expect(w_shape == want_w, f"{cls}: weight of shape {w_shape} on this rank, expected {want_w} at tp=2: "
           + ("keep the ROWS r*n:(r+1)*n of full.weight (the output features are split), n = out_features / tp"
              if column else "keep the COLUMNS r*n:(r+1)*n of full.weight (the input features are split), "
                             "n = in_features / tp"))
    expect(b_shape == want_b, f"{cls}: bias of shape {b_shape} on this rank, expected {want_b}: "
           + ("the bias is split with the output features" if column else
              "the bias stays whole on every rank (it is added once, after the all-reduce)"))
    comm.COUNTER.reset()
    y = layer(x_in)
    ref = full(x_full)
    want = ref[..., out_slice] if out_slice is not None else ref
    hint = ""
    if not column:
        r, n = g["tp_rank"], i // TP
        partial = F.linear(x_in.detach(), full.weight.detach()[:, r * n:(r + 1) * n]) + full.bias.detach()
        hint = sum_hint(y - full.bias, ref - full.bias) or (
            " -- it is this rank's partial sum only: sum the partial outputs over the group (g, reduce_from_region)"
            if close(y, partial) else "")
    expect(close(y, want),
           f"{cls}{kwargs or ''}: output differs from the full layer's (slice) -- check which rows/columns you keep"
           + (" and that the bias is added once, after the all-reduce" if not column else "") + hint)
    fwd = (1, "all_reduce") if not column else (1, "all_gather") if kwargs.get("gather_output") else (0, None)
    expect(comm.COUNTER.calls() == fwd[0] and comm.COUNTER.calls(fwd[1], "forward") == fwd[0],
           f"{cls}{kwargs or ''} forward: expected "
           + (f"exactly one {fwd[1]}" if fwd[0] else "no collective (f is the identity forward)")
           + f", counted {counted()}")
    return layer, y, ref


def check_2(ns, g):
    r = g["tp_rank"]
    torch.manual_seed(0)
    full = nn.Linear(6, 8)
    x = seeded(2, 5, 6, seed=1).requires_grad_()
    layer, y, ref = _linear_case(ns, g, "ColumnParallelLinear", full, x, x, {}, slice(r * 4, (r + 1) * 4))
    w = seeded(2, 5, 8, seed=2)
    (y * w[..., r * 4:(r + 1) * 4]).sum().backward()
    gx = x.grad.clone()
    x.grad = None
    (ref * w).sum().backward()
    expect(close(gx, x.grad), "ColumnParallelLinear: the input gradient must be the full one (f all-reduces it)")
    expect(close(layer.weight.grad, full.weight.grad[r * 4:(r + 1) * 4]), "ColumnParallelLinear: wrong weight gradient")
    _linear_case(ns, g, "ColumnParallelLinear", full, x, x, {"gather_output": True}, None)


def check_3(ns, g):
    r = g["tp_rank"]
    torch.manual_seed(0)
    full = nn.Linear(8, 6)
    x = seeded(2, 5, 8, seed=1)
    xs = x[..., r * 4:(r + 1) * 4].clone().requires_grad_()
    layer, y, ref = _linear_case(ns, g, "RowParallelLinear", full, x, xs, {}, None)
    w = seeded(2, 5, 6, seed=2)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(layer.bias.grad, full.bias.grad), "RowParallelLinear: wrong bias gradient"
           + (" -- it is 1/tp of the full one: add the whole bias once, after the all-reduce, not bias / tp on "
              "every rank" if close(layer.bias.grad, full.bias.grad / TP) else ""))
    expect(close(layer.weight.grad, full.weight.grad[:, r * 4:(r + 1) * 4]), "RowParallelLinear: wrong weight gradient")


def check_4(ns, g):
    r = g["tp_rank"]
    torch.manual_seed(0)
    full = nn.Embedding(10, 4)
    ids = torch.tensor([[0, 9, 4, 5, 5], [3, 7, 1, 8, 2]])
    layer = ns["VocabParallelEmbedding"](full, g["tp_group"])
    w_shape = tuple(getattr(getattr(layer, "weight", None), "shape", ()))
    expect(w_shape == (5, 4), f"VocabParallelEmbedding: weight of shape {w_shape} on this rank, expected (5, 4): "
           "rows r*n:(r+1)*n of the table, n = vocab / tp where tp is the size of the group you are given")
    y = layer(ids)
    ref = full(ids)
    mine = ref * ((ids >= r * 5) & (ids < (r + 1) * 5)).unsqueeze(-1)
    expect(close(y, ref), "VocabParallelEmbedding: output differs from the full embedding (mask ids outside "
                          "[vocab_start, vocab_end), then all-reduce)" + sum_hint(y, ref)
           + (" -- it holds this rank's rows only: sum the ranks' answers with reduce_from_region"
              if close(y, mine) else ""))
    w = seeded(2, 5, 4, seed=3)
    (y * w).sum().backward()
    (full(ids) * w).sum().backward()
    expect(close(layer.weight.grad, full.weight.grad[r * 5:(r + 1) * 5]), "VocabParallelEmbedding: wrong weight gradient")


def _module_case(ns, g, name, full, x, *extra):
    layer = ns[name](full, g["tp_group"])
    comm.COUNTER.reset()
    xin = x.clone().requires_grad_()
    y = layer(xin, *extra)
    fwd_counts = counted()
    expect(comm.COUNTER.calls("all_reduce", "forward") == 1 and comm.COUNTER.calls() == 1,
           f"{name}: expected exactly 1 all-reduce in the forward (column-parallel in, row-parallel out: no gather), "
           f"counted {fwd_counts}")
    local, whole = sum(p.numel() for p in layer.parameters()), sum(p.numel() for p in full.parameters())
    expect(local * TP == whole, f"{name}: {local} parameters on this rank, expected {whole} / tp = {whole // TP}: "
           "split every weight over the group you are given (tp=2), not over every rank, and replicate none")
    xr = x.clone().requires_grad_()
    ref = full(xr, *extra)
    expect(close(y, ref), f"{name}: output differs from the single-process module" + sum_hint(y, ref))
    w = seeded(*ref.shape, seed=5)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(xin.grad, xr.grad), f"{name}: the input gradient differs from the single-process one (f, "
           "copy_to_region, applied once to the input, sums the ranks' parts of it)")
    fwd, bwd = comm.COUNTER.calls("all_reduce", "forward"), comm.COUNTER.calls("all_reduce", "backward")
    expect(fwd == 1 and bwd == 1 and comm.COUNTER.calls() == 2,
           f"{name}: expected exactly 1 all-reduce forward and 1 backward, counted {counted()} "
           "(apply copy_to_region once, copy_input=False on the column-parallel layers)")


def check_5(ns, g):
    torch.manual_seed(0)
    _module_case(ns, g, "ParallelSwiGLU", SwiGLU(8, 12), seeded(2, 5, 8, seed=1))


def check_6(ns, g):

    torch.manual_seed(0)
    cos, sin = rotary_cos_sin(5, 4)
    _module_case(ns, g, "ParallelAttention", Attention(16, 4, 2, 4), seeded(2, 5, 16, seed=1), cos, sin)
    # heads * head_dim != hidden (a layout using hidden / tp breaks) and 2 K/V heads per rank with 2 query heads
    # each (a layout that ignores the GQA groups breaks; with one K/V head per rank it would not show)
    _module_case(ns, g, "ParallelAttention", Attention(20, 8, 4, 4), seeded(2, 5, 20, seed=2), cos, sin)
    for heads, kv in ((3, 3), (4, 1)):
        try:
            ns["ParallelAttention"](Attention(12, heads, kv, 4), g["tp_group"])
            raised = False
        except ValueError:
            raised = True
        expect(raised, f"ParallelAttention with {heads} heads / {kv} K/V heads at tp=2 must raise ValueError (tp "
                       "must divide num_heads and num_kv_heads: dividing the projections' widths is not enough)")


CFG = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def _grads_vs_reference(ns, g, model, loss, ids, labels, rows=slice(None)):
    ref = Llama(CFG, seed=0)
    ref_loss = ref.loss(ids, labels)
    expect(abs(float(loss) - float(ref_loss)) < 1e-5 or rows != slice(None),
           f"loss {float(loss):.6f} differs from the single-process model's {float(ref_loss):.6f}")
    ref_loss.backward()
    grads = ns["full_tensors"](model, g["tp_group"], grads=True)
    for name, p in ref.named_parameters():
        expect(name in grads, f"parameter {name} missing from the TP model (keep Llama's names)")
        expect(close(grads[name], p.grad), f"gradient of {name} differs from the single-process model's")
    return ref


def check_7(ns, g):
    ids, labels = token_batch(2, 8, CFG.vocab_size, seed=1)
    full = Llama(CFG, seed=0)
    whole = sum(p.numel() for p in full.parameters())
    norms = sum(p.numel() for n, p in full.named_parameters() if "norm" in n)
    model = ns["TPLlama"](full, g["tp_group"])
    local, want = sum(p.numel() for p in model.parameters()), (whole - norms) // TP + norms
    expect(local == want, f"TPLlama: {local} parameters on this rank, expected {want} at tp=2: split embed_tokens, "
           "every block and lm_head over the group; only the norms are replicated")
    expect(close(model(ids), Llama(CFG, seed=0)(ids)), "TPLlama: gathered logits differ from the single-process model")
    loss = model.loss(ids, labels, vocab_parallel=False)
    loss.backward()
    _grads_vs_reference(ns, g, model, loss, ids, labels)


@contextlib.contextmanager
def _counting_gathers():
    """Names of the gathering collectives of torch.distributed called inside the block (any API, even used
    directly instead of the workbook's counted gather_from_region)."""
    called: list[str] = []
    names = ("all_gather", "all_gather_into_tensor", "all_gather_object", "gather")
    saved = {name: getattr(dist, name) for name in names}

    def spy(name):
        def call(*args, **kwargs):
            called.append(name)
            return saved[name](*args, **kwargs)
        return call

    for name in names:
        setattr(dist, name, spy(name))
    try:
        yield called
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _ce_variant(logits, labels, *, own_max=False, target_everywhere=False, times=1):
    """The loss a vocab-parallel cross-entropy with one named mistake returns (tp = 2, computed whole here)."""
    z, lab = logits.reshape(-1, logits.shape[-1]).double(), labels.reshape(-1)
    n, total, target = z.shape[-1] // TP, 0.0, 0.0
    for k in range(TP):
        part = z[:, k * n:(k + 1) * n]
        m = part.amax(-1) if own_max else z.amax(-1)
        shifted = part - m.unsqueeze(-1)
        total = total + shifted.exp().sum(-1)
        picked = shifted.gather(-1, (lab - k * n).clamp(0, n - 1).unsqueeze(-1)).squeeze(-1)
        target = target + (picked if target_everywhere else picked * ((lab >= k * n) & (lab < (k + 1) * n)))
    per = (times * total).log() - times * target
    valid = lab != -100
    return float((per * valid).sum() / valid.sum())


_CE_MISTAKES = (
    ({"own_max": True}, "it matches each rank subtracting its OWN max: all-reduce the max with op=MAX over the "
                        "group first"),
    ({"target_everywhere": True}, "it matches the target logit taken on every rank: keep it only on the rank whose "
                                  "slice holds the label (0 elsewhere)"),
    ({"times": 2}, "it matches sums all-reduced over every rank, not over the TP group: pass the group"),
)


def _ce_hint(loss, logits, labels):
    for kwargs, words in _CE_MISTAKES:
        if abs(float(loss) - _ce_variant(logits, labels, **kwargs)) < 1e-5:
            return f" -- {words}"
    return ""


def check_8(ns, g):
    r = g["tp_rank"]
    logits = seeded(2, 6, 10, seed=7).requires_grad_()
    labels = torch.tensor([[0, 9, 4, 5, -100, 5], [3, 7, 1, 8, 2, 6]])
    local = logits.detach()[..., r * 5:(r + 1) * 5].clone().requires_grad_()
    comm.COUNTER.reset()
    with _counting_gathers() as gathers:  # torch.distributed's own gathers too, not only the workbook's
        loss = ns["vocab_parallel_cross_entropy"](local, labels, g["tp_group"])
    ref = F.cross_entropy(logits.reshape(-1, 10), labels.reshape(-1), ignore_index=-100)
    expect(not gathers, f"vocab_parallel_cross_entropy must not gather the logits (it called {', '.join(gathers)})")
    expect(abs(float(loss) - float(ref)) < 1e-5, f"vocab-parallel loss {float(loss):.6f} != F.cross_entropy "
           f"{float(ref):.6f}" + _ce_hint(loss, logits.detach(), labels))
    loss.backward()
    ref.backward()
    expect(close(local.grad, logits.grad[..., r * 5:(r + 1) * 5]), "vocab_parallel_cross_entropy: wrong gradient of "
           "the local logits (use reduce_from_region for the sums so that autograd reaches every rank)")
    expect(comm.COUNTER.calls("all_gather") == 0, "vocab_parallel_cross_entropy must not gather the logits")
    big = seeded(2, 6, 10, seed=8) * 5 + 100  # exp(100) overflows float32: only a shifted exp stays finite
    with torch.no_grad():
        loss = ns["vocab_parallel_cross_entropy"](big[..., r * 5:(r + 1) * 5].clone(), labels, g["tp_group"])
    ref = F.cross_entropy(big.reshape(-1, 10), labels.reshape(-1), ignore_index=-100)
    expect(bool(torch.isfinite(loss)) and abs(float(loss) - float(ref)) < 1e-4,
           f"vocab_parallel_cross_entropy with logits near 100: {float(loss)} instead of {float(ref):.5f} -- exp "
           "overflows: subtract the global max (all-reduced with MAX) before exp" + _ce_hint(loss, big, labels))
    ids, lab = token_batch(2, 8, CFG.vocab_size, seed=1)
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
    loss = model.loss(ids, lab)
    loss.backward()
    _grads_vs_reference(ns, g, model, loss, ids, lab)


class _Group:
    """What the spy below returns instead of a process group: the ranks it was asked for."""

    def __init__(self, ranks):
        self.ranks = list(ranks)


@contextlib.contextmanager
def _recording_new_group():
    """dist.new_group replaced by a recorder (no group is really made, so that a wrong sequence of calls cannot
    leave the ranks waiting for each other): yields the list of rank lists asked for, in order."""
    from torch.distributed import distributed_c10d as c10d

    calls: list[list[int]] = []

    def fake(ranks=None, *args, **kwargs):
        grp = _Group(range(dist.get_world_size()) if ranks is None else sorted(int(x) for x in ranks))
        calls.append(grp.ranks)
        return grp

    saved = dist.new_group, c10d.new_group
    dist.new_group = c10d.new_group = fake
    try:
        yield calls
    finally:
        dist.new_group, c10d.new_group = saved


def _check_groups(fn, args, label, want, kind):
    """``fn(*args)`` must call new_group for every group of ``want`` on every rank, in one order shared by all
    ranks, and return this rank's group."""
    rank = dist.get_rank()
    with _recording_new_group() as calls:
        got = fn(*args)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, calls)
    if all(not c for c in everyone) and got is not None and not isinstance(got, _Group):
        # real groups, made through a name bound before the spy (from torch.distributed import new_group): only
        # the group returned can be checked
        calls, everyone = want, [want] * len(everyone)
    expect(sorted(calls) == sorted(want) or not set(map(tuple, calls)) < set(map(tuple, want)),
           f"{label}: rank {rank} created only {calls}: call dist.new_group for every {kind} group {want} on every "
           "rank, also for the groups it is not in (new_group is collective)")
    expect(sorted(calls) == sorted(want), f"{label} on 4 processes created the groups {calls}, expected {want}")
    expect(all(c == everyone[0] for c in everyone), f"{label}: the ranks created the groups in different orders "
           f"({everyone[0]} on rank 0, {calls} on rank {rank}): every rank must make the same calls in the same order")
    ranks = got.ranks if isinstance(got, _Group) else (dist.get_process_group_ranks(got) if got is not None else None)
    mine = next(grp for grp in want if rank in grp)
    expect(ranks == mine, f"{label}: rank {rank} got the group {ranks}, expected {mine}: return the group this rank "
           "belongs to")


def check_9(ns, g):
    for tp in (2, 4, 1):
        want = [list(range(k * tp, (k + 1) * tp)) for k in range(4 // tp)]
        _check_groups(ns["make_tp_group"], (tp,), f"make_tp_group(tp={tp})", want, "TP")


def check_10(ns, g):
    for tp, dp in ((2, 2), (4, 1), (1, 4)):
        want = [list(range(i, 4, tp)) for i in range(tp)]
        _check_groups(ns["make_dp_group"], (tp, dp), f"make_dp_group(tp={tp}, dp={dp})", want, "DP")


def check_11(ns, g):
    ids, labels = token_batch(4, 8, CFG.vocab_size, seed=2)
    rows = slice(2 * g["dp_rank"], 2 * g["dp_rank"] + 2)
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
    loss = model.loss(ids[rows], labels[rows])
    loss.backward()
    before = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dp_sum, tp_sum, world_sum = before.clone(), before.clone(), before.clone()
    dist.all_reduce(dp_sum, group=g["dp_group"])
    dist.all_reduce(tp_sum, group=g["tp_group"])
    dist.all_reduce(world_sum)
    ns["average_gradients"](model, g["dp_group"])
    after = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    named = ((dp_sum, "summed over the DP group but not divided by its size"),
             (dp_sum / 4, "divided twice by the DP group size"),
             (before, "left as they were (each replica keeps its own)"),
             (world_sum / 2, "summed over every rank: reduce over dp_group only"),
             (world_sum / 4, "averaged over every rank: reduce over dp_group only"),
             (tp_sum / 2, "averaged over the TP group (its ranks hold different slices): reduce over dp_group"))
    why = next((words for want, words in named if close(after, want, 1e-6)), None)
    expect(close(after, dp_sum / 2, 1e-6) or why is None, f"average_gradients: the gradients were {why}")
    _grads_vs_reference(ns, g, model, loss, ids, labels, rows)
    metric = ns["reduce_over_dp"](torch.tensor(float(g["dp_rank"] + 1)), torch.tensor(2.0), g["dp_group"])
    expect(abs(float(metric) - 3 / 4) < 1e-9, f"reduce_over_dp: expected (1 + 2) / (2 + 2) = 0.75 over the DP group only, "
           f"got {metric} (sum over dp_group, not over all ranks)")
    # Numbers that differ on every rank: a sum over all ranks (or over the TP group) no longer gives the same ratio
    # (with identical numbers on the TP ranks it would, as each would be counted tp times above and below)
    rank = dist.get_rank()
    members = [rank % 2, rank % 2 + 2]
    metric = ns["reduce_over_dp"](torch.tensor(float(rank + 1)), torch.tensor(float(3 * rank + 2)), g["dp_group"])
    want = sum(m + 1 for m in members) / sum(3 * m + 2 for m in members)
    means = sum((m + 1) / (3 * m + 2) for m in members) / len(members)
    hint = (": that is the mean of the replicas' means -- sum loss_sum and count over dp_group, then divide once"
            if abs(float(metric) - means) < 1e-9 else ": reduce over dp_group, not over all ranks")
    expect(abs(float(metric) - want) < 1e-9, f"reduce_over_dp: with different numbers on every rank expected {want:.4f} "
           f"(sums over the DP group only), got {metric}" + hint)


# ----------------------------------------------------------------------------------------------------
# Balise 12: sequence parallelism
# ----------------------------------------------------------------------------------------------------
SP_CFG = TransformerConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=12,
                           num_kv_heads=6)  # every split divides by 2 and by 3
CHUNK, HIDDEN = 3, 5  # tokens per rank, hidden size: batch 2, seq 3·tp, hidden 5 -- three different sizes


def _agree(problem, group):
    """Every rank of ``group`` learns whether one of them found a problem (so that they stop together and no
    rank waits in a collective its peers skipped)."""
    flag = torch.tensor([0.0 if problem is None else 1.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return (problem or "a peer of this rank found a problem") if flag.item() > 0 else None


def _first_line(exc):
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:150] if str(exc).strip() else ''}"


def _sp_stages(ns, group, tp, r):
    """The checks of balise 12 on one TP group of ``tp`` ranks (this rank is ``r``), in order; each returns None or
    what is wrong."""
    gather, scatter = ns["gather_from_sequence_region"], ns["reduce_scatter_to_sequence_region"]
    chunk = slice(r * CHUNK, (r + 1) * CHUNK)
    st = {}

    def counts_are(op, phase, what):
        if comm.COUNTER.calls(op, phase) == 1 and comm.COUNTER.calls() == 1:
            return None
        if comm.COUNTER.calls("all_reduce"):
            return (f"{what}: counted {counted()} -- an all-reduce of the whole tensor then a chunk gives the right "
                    f"numbers but moves tp x more than needed and keeps the full tensor: use "
                    f"{'reduce_scatter_along' if op == 'reduce_scatter' else 'all_gather_along'} (phase='{phase}')")
        return f"{what}: expected exactly one {op} (phase='{phase}'), counted {counted()}"

    def gather_forward():
        parts = [seeded(2, CHUNK, HIDDEN, seed=100 + k) for k in range(tp)]
        st["x"] = parts[r].clone().requires_grad_()
        comm.COUNTER.reset()
        st["y"] = y = gather(st["x"], group)
        want = torch.cat(parts, dim=1)
        shape = tuple(y.shape)
        name = "gather_from_sequence_region forward"
        if shape == (2, CHUNK, HIDDEN * tp):
            return f"{name} gathered along the last dim (hidden): gather along the sequence, dim 1"
        if shape == (2 * tp, CHUNK, HIDDEN):
            return f"{name} gathered along the batch (dim 0): gather along the sequence, dim 1"
        if shape == (2, CHUNK * 4, HIDDEN) and tp == 2:
            return f"{name} gathered the tokens of every rank (4), not of the TP group: pass the group"
        if shape != tuple(want.shape):
            return f"{name}: shape {shape}, expected {tuple(want.shape)} (the ranks' chunks of the sequence, dim 1)"
        if not close(y, want):
            got_parts = y.detach().split(CHUNK, dim=1)
            order = [next((k for k in range(tp) if close(c, parts[k])), None) for c in got_parts]
            if sorted(o for o in order if o is not None) == list(range(tp)):
                return (f"{name}: the chunks are not in rank order (got ranks {order}): rank k's tokens go to "
                        "positions [k*s/tp, (k+1)*s/tp)")
            return f"{name}: values differ from the ranks' chunks concatenated along dim 1"
        return counts_are("all_gather", "forward", name)

    def gather_backward():
        ws = [seeded(2, CHUNK * tp, HIDDEN, seed=200 + k) for k in range(tp)]  # a different upstream on each rank
        comm.COUNTER.reset()
        (st["y"] * ws[r]).sum().backward()
        want = sum(w[:, chunk] for w in ws)
        got, name = st["x"].grad, "gather_from_sequence_region backward"
        if got is None or got.shape != want.shape:
            return f"{name}: gradient of shape {None if got is None else tuple(got.shape)}, expected {tuple(want.shape)}"
        if not close(got, want):
            if close(got, ws[r][:, chunk]):
                return (f"{name} keeps this rank's chunk of its own gradient: each rank's gradient of the gathered "
                        "tensor is a partial sum, so sum them over the group and keep this rank's chunk (reduce-scatter)")
            return f"{name}: wrong gradient of this rank's tokens" + sum_hint(got, want)
        return counts_are("reduce_scatter", "backward", name)

    def scatter_forward():
        parts = [seeded(2, CHUNK * tp, HIDDEN, seed=300 + k) for k in range(tp)]
        st["xp"] = parts[r].clone().requires_grad_()
        comm.COUNTER.reset()
        st["z"] = z = scatter(st["xp"], group)
        total, name = sum(parts), "reduce_scatter_to_sequence_region forward"
        want = total[:, chunk]
        if tuple(z.shape) == tuple(total.shape) and close(z, total):
            return (f"{name} returns the whole sum: keep only this rank's chunk of the sequence (a reduce-scatter, "
                    "not an all-reduce)")
        if tuple(z.shape) != tuple(want.shape):
            return f"{name}: shape {tuple(z.shape)}, expected {tuple(want.shape)} (this rank's seq/tp tokens, dim 1)"
        if not close(z, want):
            other = next((k for k in range(tp) if k != r and close(z, total[:, k * CHUNK:(k + 1) * CHUNK])), None)
            if other is not None:
                return (f"{name}: rank {r} of the group got the tokens of chunk {other}: rank r keeps chunk r, "
                        "[r*s/tp, (r+1)*s/tp) (its rank in the group)")
            if close(z, total[:, r::tp]):
                return (f"{name}: rank {r} kept one token in {tp} (a strided split): keep the contiguous chunk "
                        "[r*s/tp, (r+1)*s/tp), the order in which the all-gather puts the chunks back")
            if close(z, parts[r][:, chunk]):
                return f"{name} keeps this rank's chunk of its own partial output: sum over the group first"
            return f"{name}: values differ from the sum's chunk" + sum_hint(z, want)
        return counts_are("reduce_scatter", "forward", name)

    def scatter_backward():
        gs = [seeded(2, CHUNK, HIDDEN, seed=400 + k) for k in range(tp)]
        comm.COUNTER.reset()
        name = "reduce_scatter_to_sequence_region backward"
        try:
            (st["z"] * gs[r]).sum().backward()
        except RuntimeError as exc:
            return (f"{name} returned a gradient of the wrong shape ({_first_line(exc)[:90]}): the input covered the "
                    "whole sequence, so all-gather the gradient along the sequence (dim 1)")
        want, got = torch.cat(gs, dim=1), st["xp"].grad
        if not close(got, want):
            return f"{name}: wrong gradient: every rank's chunk of the gradient, all-gathered along dim 1 in rank order"
        return counts_are("all_gather", "backward", name)

    def not_divisible():
        xs = seeded(2, CHUNK * tp + 1, HIDDEN, seed=500)
        try:
            z = scatter(xs, group)
        except ValueError:
            return None
        return (f"reduce_scatter_to_sequence_region of {CHUNK * tp + 1} tokens over {tp} ranks returned shape "
                f"{tuple(z.shape)}: tp must divide the sequence -- raise a ValueError (reduce_scatter_along does)")

    def whole_model():
        ids, labels = token_batch(2, 12, SP_CFG.vocab_size, seed=4)
        ref = Llama(SP_CFG, seed=0)
        ref_loss = ref.loss(ids, labels)
        ref_loss.backward()
        model = lib.TPLlama(Llama(SP_CFG, seed=0), group, sequence_parallel=True)
        comm.COUNTER.reset()
        with lib.sequence_regions(gather, scatter):
            loss = model.loss(ids, labels)
            loss.backward()
        if comm.COUNTER.calls("all_reduce", "backward") or comm.COUNTER.calls("all_reduce", "forward") != 1:
            return f"TPLlama(sequence_parallel=True) with your regions: counted {counted()}: no activation all-reduce"
        lib.reduce_sequence_parallel_grads(model, group)
        grads = lib.full_tensors(model, group, grads=True)
        if abs(float(loss) - float(ref_loss)) > 1e-5:
            return f"TPLlama(sequence_parallel=True) with your regions: loss {float(loss):.6f} != {float(ref_loss):.6f}"
        bad = [n for n, p in ref.named_parameters() if not close(grads[n], p.grad)]
        return f"TPLlama(sequence_parallel=True) with your regions: gradients of {bad[:3]} differ" if bad else None

    return [gather_forward, gather_backward, scatter_forward, scatter_backward, not_divisible, whole_model]


def check_12(ns, g):
    for tp, group, r in ((TP, g["tp_group"], g["tp_rank"]), (3, g["tp3_group"], g["tp3_rank"])):
        problem = None
        if r is not None:  # rank 3 is outside the group of 3: it only joins the verdict
            for stage in _sp_stages(ns, group, tp, r):
                try:
                    found = stage()
                except NotImplementedError:
                    raise
                except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                    found = f"{stage.__name__}: {_first_line(exc)}"
                    if f"over {dist.get_world_size()} ranks" in found:
                        found += (f" -- {dist.get_world_size()} ranks is every process, not the TP group of {tp}: pass "
                                  "the group to every collective (ctx.group in the backward)")
                problem = _agree(found, group)
                if problem:
                    break
        expect(problem is None, f"tp={tp}: {problem}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = init_distributed(backend="gloo", device="cpu", timeout_s=60)
    results = {}
    try:
        ns = load_exercises(sys.argv[1])
        rank = dist.get_rank()
        groups = {}
        for ranks in ([0, 1], [2, 3]):
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups["tp_group"] = grp
        for ranks in ([0, 2], [1, 3]):
            grp = dist.new_group(ranks)
            if rank in ranks:
                groups["dp_group"] = grp
        groups.update(tp_rank=rank % 2, dp_rank=rank // 2)
        grp = dist.new_group([0, 1, 2])  # balise 12 at tp = 3
        groups.update(tp3_group=grp if rank < 3 else None, tp3_rank=rank if rank < 3 else None)
        for n in range(1, 13):
            try:
                globals()[f"check_{n}"](ns, groups)
                expect(True, "another rank failed this check")  # every rank leaves the check together
                results[str(n)] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the checker
                if not isinstance(exc, Bad):
                    fail_together()
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                results[str(n)] = line if not isinstance(exc, Bad) else f"Bad: {exc}"
        write_record({"results": results})
    finally:
        teardown()
