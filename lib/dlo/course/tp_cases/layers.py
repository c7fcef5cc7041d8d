"""Balises 1-4 on real peers: the communication primitives, the column- and row-parallel layers and the vocabulary-
parallel embedding, each on the generated cases of :mod:`.draw` (tp = 2 on a strided group in float32 and float64,
tp = 4, tp = 3 on a subset of the processes, tp = 1; sizes drawn per case), values AND gradients compared with the
full layer's. Each ``check_<n>(ns, g)`` raises :class:`dlo.course.tp_cases.Bad` naming the mistake and the case, on
every rank together.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.tp_cases import close, counted, expect, precision_hint, seeded, sum_hint
from dlo.course.tp_cases.draw import ids_for, plan, settings, sizes
from dlo.parallel import comm


def where(s, dtype, extra=""):
    """The case in words, at the head of every message: 'tp=3 on the group [0, 2, 3] (rank 1 in it), float64, ...: '"""
    return f"{s.label}, {str(dtype).replace('torch.', '')}{', ' + extra if extra else ''}: "


def build(ns, cls, s, at, *args, **kwargs):
    """``ns[cls](*args, s.group, **kwargs)``; a ValueError on sizes this case's tp divides is a failed check, named
    when it says the layer was split over every process instead of the group."""
    try:
        return ns[cls](*args, s.group, **kwargs)
    except ValueError as exc:
        world = dist.get_world_size()
        why = (f" -- tp={world} is the number of all processes: split over the group you are given (tp={s.tp}), "
               "not over every rank" if f"tp={world}" in str(exc) and s.tp != world else "")
        expect(False, at + f"{cls} raised ValueError although tp={s.tp} divides every size here: {exc}{why}")


def _cases(g):
    return plan(settings(g["rank"], g))


def _primitives(ns, s, dtype, seed):
    tp, r, grp, at = s.tp, s.r, s.group, where(s, dtype)
    width, one = 3 + seed % 3, int(s.tp > 1)  # at tp = 1 the counted collectives return their input, uncounted
    x_all = [seeded(2, 3, width, seed=10 * seed + k).to(dtype) for k in range(tp)]
    w_all = [seeded(2, 3, width, seed=20 * seed + k + 7).to(dtype) for k in range(tp)]
    x, w = x_all[r].clone().requires_grad_(), w_all[r]
    comm.COUNTER.reset()
    y = ns["copy_to_region"](x, grp)
    expect(close(y, x), at + "copy_to_region forward must be the identity")
    (y * w).sum().backward()
    expect(close(x.grad, sum(w_all)), at + "copy_to_region backward must all-reduce (sum) the gradient over the TP group")
    expect(comm.COUNTER.calls("all_reduce", "backward") == one and comm.COUNTER.calls() == one,
           at + "copy_to_region: exactly one all-reduce, in backward (use dlo.parallel.comm.all_reduce with "
                "phase='backward')")
    x.grad = None
    comm.COUNTER.reset()
    y = ns["reduce_from_region"](x, grp)
    expect(close(y, sum(x_all)), at + "reduce_from_region forward must all-reduce (sum) over the TP group"
           + sum_hint(y, sum(x_all), tp))
    expect(comm.COUNTER.calls("all_reduce", "forward") == one and comm.COUNTER.calls() == one,
           at + f"reduce_from_region forward: expected exactly one all_reduce (phase='forward'), counted {counted()}")
    comm.COUNTER.reset()
    (y * w).sum().backward()
    expect(close(x.grad, w), at + "reduce_from_region backward must be the identity (each partial's gradient is the "
                                  "sum's gradient, unchanged)")
    expect(comm.COUNTER.calls() == 0, at + f"reduce_from_region backward is the identity: no collective, counted "
                                           f"{counted()}")
    _gather_and_scatter(ns, s, dtype, seed, x_all, w_all)


def _gather_and_scatter(ns, s, dtype, seed, x_all, w_all):
    tp, r, grp, at = s.tp, s.r, s.group, where(s, dtype)
    width, one = x_all[0].shape[-1], int(s.tp > 1)
    x = x_all[r].clone().requires_grad_()
    comm.COUNTER.reset()
    y = ns["gather_from_region"](x, grp)
    expect(close(y, torch.cat(x_all, dim=-1)), at + "gather_from_region forward: all-gather along the last dim, rank "
                                                    "order")
    expect(comm.COUNTER.calls("all_gather", "forward") == one and comm.COUNTER.calls() == one,
           at + f"gather_from_region forward: expected exactly one all_gather (all_gather_last_dim), counted "
                f"{counted()}")
    comm.COUNTER.reset()
    wg = seeded(2, 3, width * tp, seed=30 + seed).to(dtype)
    (y * wg).sum().backward()
    expect(close(x.grad, wg[..., r * width:(r + 1) * width]), at + "gather_from_region backward: keep this rank's "
           "slice (every rank already holds the whole gradient: no sum)")
    expect(comm.COUNTER.calls() == 0, at + f"gather_from_region backward: keep this rank's slice, no collective; "
                                           f"counted {counted()}")
    full = seeded(2, 3, width * tp, seed=40 + seed).to(dtype).requires_grad_()
    comm.COUNTER.reset()
    y = ns["scatter_to_region"](full, grp)
    expect(close(y, full.detach()[..., r * width:(r + 1) * width]), at + "scatter_to_region forward: this rank's "
                                                                         "slice")
    expect(comm.COUNTER.calls() == 0, at + f"scatter_to_region forward: take this rank's slice, no collective; "
                                           f"counted {counted()}")
    (y * w_all[r]).sum().backward()
    expect(close(full.grad, torch.cat(w_all, dim=-1)), at + "scatter_to_region backward: all-gather the gradient")
    expect(comm.COUNTER.calls("all_gather", "backward") == one and comm.COUNTER.calls() == one,
           at + f"scatter_to_region backward: expected exactly one all_gather (phase='backward'), counted {counted()}")


def check_1(ns, g):
    for s, dtype, seed in _cases(g):
        _primitives(ns, s, dtype, seed)


def _linear(i, o, dtype, seed):
    torch.manual_seed(seed)
    return nn.Linear(i, o).to(dtype)


def _shapes(layer, cls, full, s, at):
    column = cls == "ColumnParallelLinear"
    o, i, tp = full.out_features, full.in_features, s.tp
    want_w, want_b = ((o // tp, i), (o // tp,)) if column else ((o, i // tp), (o,))
    w_shape = tuple(getattr(getattr(layer, "weight", None), "shape", ()))
    b_shape = tuple(getattr(getattr(layer, "bias", None), "shape", ()))
    expect(w_shape == want_w, at + f"{cls}: weight of shape {w_shape} on this rank, expected {want_w}: "
           + ("keep the ROWS r*n:(r+1)*n of full.weight (the output features are split), n = out_features / tp"
              if column else "keep the COLUMNS r*n:(r+1)*n of full.weight (the input features are split), "
                             "n = in_features / tp"))
    expect(b_shape == want_b, at + f"{cls}: bias of shape {b_shape} on this rank, expected {want_b}: "
           + ("the bias is split with the output features" if column else
              "the bias stays whole on every rank (it is added once, after the all-reduce)"))


def _other_rank(y, ref, s):
    """A column-parallel output that is another rank's slice, named (the rank in the world taken for the rank in
    the group shows on the strided groups)."""
    n = ref.shape[-1] // s.tp
    other = next((k for k in range(s.tp) if k != s.r and close(y, ref[..., k * n:(k + 1) * n])), None)
    if other is None:
        return ""
    return (f" -- this rank (rank {s.r} in its group) holds the output features of rank {other}: r is the rank inside "
            "the group you are given, group_rank(group), not the rank among all processes")


def _linear_case(ns, s, at, cls, full, x_full, x_in, kwargs, out_slice):
    layer = build(ns, cls, s, at, full, **kwargs)
    column = cls == "ColumnParallelLinear"
    _shapes(layer, cls, full, s, at)
    comm.COUNTER.reset()
    y = layer(x_in)
    ref = full(x_full)
    want = ref[..., out_slice] if out_slice is not None else ref
    expect(y.dtype == ref.dtype, at + f"{cls}: the output is {str(y.dtype).replace('torch.', '')} for a layer and an "
           f"input in {str(ref.dtype).replace('torch.', '')}: keep their dtype (a buffer made without dtype= is float32)")
    hint = _other_rank(y, ref, s) if column and out_slice is not None else ""
    if not column:
        r, n = s.r, full.in_features // s.tp
        partial = F.linear(x_in.detach(), full.weight.detach()[:, r * n:(r + 1) * n]) + full.bias.detach()
        hint = sum_hint(y - full.bias, ref - full.bias, s.tp) or (
            " -- it is this rank's partial sum only: sum the partial outputs over the group (g, reduce_from_region)"
            if s.tp > 1 and close(y, partial) else "")
    expect(close(y, want),
           at + f"{cls}{kwargs or ''}: output differs from the full layer's (slice) -- check which rows/columns you "
                "keep" + (" and that the bias is added once, after the all-reduce" if not column else "") + hint
           + precision_hint(y, want))
    one = int(s.tp > 1)
    fwd = (one, "all_reduce") if not column else (one, "all_gather") if kwargs.get("gather_output") else (0, None)
    expect(comm.COUNTER.calls() == fwd[0] and comm.COUNTER.calls(fwd[1], "forward") == fwd[0],
           at + f"{cls}{kwargs or ''} forward: expected "
           + (f"exactly one {fwd[1]}" if fwd[0] else "no collective (f is the identity forward)")
           + f", counted {counted()}")
    return layer, y, ref


def _column(ns, s, dtype, seed):
    size = sizes(s.tp, seed)
    hidden, wide, r = size["hidden"], size["wide"], s.r
    n, at = wide // s.tp, where(s, dtype, f"Linear({hidden} -> {wide})")
    full = _linear(hidden, wide, dtype, seed)
    x = seeded(2, 5, hidden, seed=seed).to(dtype).requires_grad_()
    mine = slice(r * n, (r + 1) * n)
    layer, y, ref = _linear_case(ns, s, at, "ColumnParallelLinear", full, x, x, {}, mine)
    w = seeded(2, 5, wide, seed=seed + 50).to(dtype)
    (y * w[..., mine]).sum().backward()
    gx = x.grad.clone()
    x.grad = None
    (ref * w).sum().backward()
    expect(close(gx, x.grad), at + "ColumnParallelLinear: the input gradient must be the full one (f all-reduces it)")
    expect(close(layer.weight.grad, full.weight.grad[mine]), at + "ColumnParallelLinear: wrong weight gradient")
    expect(close(layer.bias.grad, full.bias.grad[mine]), at + "ColumnParallelLinear: wrong bias gradient")
    layer, y, ref = _linear_case(ns, s, at, "ColumnParallelLinear", full, x, x, {"gather_output": True}, None)
    full.zero_grad()
    x.grad = None
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(layer.weight.grad, full.weight.grad[mine]), at + "ColumnParallelLinear(gather_output=True): wrong "
           "weight gradient (the gathered output's backward keeps this rank's slice of the gradient)")


def check_2(ns, g):
    for s, dtype, seed in _cases(g):
        _column(ns, s, dtype, seed)


def _row(ns, s, dtype, seed):
    size = sizes(s.tp, seed)
    hidden, wide, r = size["hidden"], size["wide"], s.r
    n, at = wide // s.tp, where(s, dtype, f"Linear({wide} -> {hidden})")
    full = _linear(wide, hidden, dtype, seed)
    x = seeded(2, 5, wide, seed=seed).to(dtype).requires_grad_()
    mine = slice(r * n, (r + 1) * n)
    xs = x.detach()[..., mine].clone().requires_grad_()
    layer, y, ref = _linear_case(ns, s, at, "RowParallelLinear", full, x, xs, {}, None)
    w = seeded(2, 5, hidden, seed=seed + 50).to(dtype)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(layer.bias.grad, full.bias.grad), at + "RowParallelLinear: wrong bias gradient"
           + (" -- it is 1/tp of the full one: add the whole bias once, after the all-reduce, not bias / tp on "
              "every rank" if s.tp > 1 and close(layer.bias.grad, full.bias.grad / s.tp) else ""))
    expect(close(layer.weight.grad, full.weight.grad[:, mine]), at + "RowParallelLinear: wrong weight gradient")
    expect(close(xs.grad, x.grad[..., mine]), at + "RowParallelLinear: wrong gradient of this rank's input slice")


def check_3(ns, g):
    for s, dtype, seed in _cases(g):
        _row(ns, s, dtype, seed)


def _embedding(ns, s, dtype, seed):
    r, tp = s.r, s.tp
    size = sizes(tp, seed)
    vocab, dim = size["vocab"], size["hidden"]
    n, at = vocab // tp, where(s, dtype, f"Embedding({vocab}, {dim})")
    torch.manual_seed(seed)
    full = nn.Embedding(vocab, dim).to(dtype)
    ids = ids_for(vocab, tp, seed)
    layer = build(ns, "VocabParallelEmbedding", s, at, full)
    w_shape = tuple(getattr(getattr(layer, "weight", None), "shape", ()))
    expect(w_shape == (n, dim), at + f"VocabParallelEmbedding: weight of shape {w_shape} on this rank, expected "
           f"{(n, dim)}: rows r*n:(r+1)*n of the table, n = vocab / tp where tp is the size of the group you are given")
    y = layer(ids)
    ref = full(ids)
    expect(y.dtype == ref.dtype, at + f"VocabParallelEmbedding: the output is {str(y.dtype).replace('torch.', '')} for "
           f"a table in {str(ref.dtype).replace('torch.', '')}: keep its dtype (a buffer made without dtype= is float32)")
    mine = ref * ((ids >= r * n) & (ids < (r + 1) * n)).unsqueeze(-1)
    expect(close(y, ref), at + "VocabParallelEmbedding: output differs from the full embedding (mask ids outside "
                               "[vocab_start, vocab_end), then all-reduce)" + sum_hint(y, ref, tp)
           + (" -- it holds this rank's rows only: sum the ranks' answers with reduce_from_region"
              if tp > 1 and close(y, mine) else "") + precision_hint(y, ref))
    w = seeded(2, 7, dim, seed=seed + 3).to(dtype)
    (y * w).sum().backward()
    (full(ids) * w).sum().backward()
    expect(close(layer.weight.grad, full.weight.grad[r * n:(r + 1) * n]), at + "VocabParallelEmbedding: wrong weight "
                                                                                "gradient")


def check_4(ns, g):
    for s, dtype, seed in _cases(g):
        _embedding(ns, s, dtype, seed)
