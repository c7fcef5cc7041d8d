"""Balises 1-8 on real peers: the communication primitives, the column- and row-parallel layers, the vocabulary-
parallel embedding, the parallel MLP and attention, the whole TP Llama and the vocabulary-parallel cross-entropy.
Each ``check_<n>(ns, g)`` raises :class:`dlo.course.tp_cases.Bad` naming the mistake, on every rank together.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.tp_cases import CFG, TP, _grads_vs_reference, close, counted, expect, seeded, sum_hint
from dlo.models.llama import Attention, Llama, SwiGLU, rotary_cos_sin, token_batch
from dlo.parallel import comm


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
