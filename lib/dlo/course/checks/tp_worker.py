"""Worker started by the ``tp`` checkers: 4 gloo processes import the student's tp_balises.py and check every
balise that needs real peers, in one run (process start-up is the expensive part).

Usage (through dlo.runtime.launch.launch, nproc=4): ``tp_worker.py SCRIPT``. The worker builds its own TP
groups {0,1} {2,3} and DP groups {0,2} {1,3} with ``dist.new_group`` so that balises 1-8 are checked at
tp = 2 whatever balises 9-10 do; any collective that ignores its group (sums over 4 ranks instead of 2)
shows up as a wrong number. Each rank writes one record ``{"results": {"1": "ok" | "Type: message", ...}}``.
"""
import contextlib
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dlo  # noqa: F401
from dlo.course.checks.framework import load_exercises
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record
from dlo.models.llama import Attention, Llama, SwiGLU, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel import comm
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
    y = ns["reduce_from_region"](x, tpg)
    expect(close(y, sum(x_all)), "reduce_from_region forward must all-reduce (sum) over the TP group")
    (y * w).sum().backward()
    expect(close(x.grad, w), "reduce_from_region backward must be the identity")
    x.grad = None
    y = ns["gather_from_region"](x, tpg)
    expect(close(y, torch.cat(x_all, dim=-1)), "gather_from_region forward: all-gather along the last dim, rank order")
    wg = seeded(2, 3, 4 * TP, seed=30)
    (y * wg).sum().backward()
    expect(close(x.grad, wg[..., r * 4:(r + 1) * 4]), "gather_from_region backward: keep this rank's slice")
    full = seeded(2, 3, 4 * TP, seed=40).requires_grad_()
    y = ns["scatter_to_region"](full, tpg)
    expect(close(y, full.detach()[..., r * 4:(r + 1) * 4]), "scatter_to_region forward: this rank's slice")
    (y * w).sum().backward()
    expect(close(full.grad, torch.cat(w_all, dim=-1)), "scatter_to_region backward: all-gather the gradient")


def _linear_case(ns, g, cls, full, x_full, x_in, kwargs, out_slice):
    layer = ns[cls](full, g["tp_group"], **kwargs)
    y = layer(x_in)
    ref = full(x_full)
    expect(close(y, ref[..., out_slice] if out_slice is not None else ref),
           f"{cls}{kwargs or ''}: output differs from the full layer's (slice) -- check which rows/columns you keep"
           + (" and that the bias is added once, after the all-reduce" if cls == "RowParallelLinear" else ""))
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
    expect(close(layer.bias.grad, full.bias.grad), "RowParallelLinear: wrong bias gradient")
    expect(close(layer.weight.grad, full.weight.grad[:, r * 4:(r + 1) * 4]), "RowParallelLinear: wrong weight gradient")


def check_4(ns, g):
    r = g["tp_rank"]
    torch.manual_seed(0)
    full = nn.Embedding(10, 4)
    ids = torch.tensor([[0, 9, 4, 5, 5], [3, 7, 1, 8, 2]])
    layer = ns["VocabParallelEmbedding"](full, g["tp_group"])
    y = layer(ids)
    expect(close(y, full(ids)), "VocabParallelEmbedding: output differs from the full embedding (mask ids outside "
                                "[vocab_start, vocab_end), then all-reduce)")
    w = seeded(2, 5, 4, seed=3)
    (y * w).sum().backward()
    (full(ids) * w).sum().backward()
    expect(close(layer.weight.grad, full.weight.grad[r * 5:(r + 1) * 5]), "VocabParallelEmbedding: wrong weight gradient")


def _module_case(ns, g, name, full, x, *extra):
    layer = ns[name](full, g["tp_group"])
    comm.COUNTER.reset()
    xin = x.clone().requires_grad_()
    y = layer(xin, *extra)
    xr = x.clone().requires_grad_()
    ref = full(xr, *extra)
    expect(close(y, ref), f"{name}: output differs from the single-process module")
    w = seeded(*ref.shape, seed=5)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(xin.grad, xr.grad), f"{name}: the input gradient differs from the single-process one")
    fwd, bwd = comm.COUNTER.calls("all_reduce", "forward"), comm.COUNTER.calls("all_reduce", "backward")
    expect(fwd == 1 and bwd == 1 and comm.COUNTER.calls() == 2,
           f"{name}: expected exactly 1 all-reduce forward and 1 backward, counted {comm.COUNTER.summary()} "
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
        except ValueError:
            continue
        raise Bad(f"ParallelAttention with {heads} heads / {kv} K/V heads at tp=2 must raise ValueError")


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
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
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
    expect(abs(float(loss) - float(ref)) < 1e-5, f"vocab-parallel loss {float(loss):.6f} != F.cross_entropy {float(ref):.6f}")
    loss.backward()
    ref.backward()
    expect(close(local.grad, logits.grad[..., r * 5:(r + 1) * 5]), "vocab_parallel_cross_entropy: wrong gradient of "
           "the local logits (use reduce_from_region for the sums so that autograd reaches every rank)")
    expect(comm.COUNTER.calls("all_gather") == 0, "vocab_parallel_cross_entropy must not gather the logits")
    ids, lab = token_batch(2, 8, CFG.vocab_size, seed=1)
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
    loss = model.loss(ids, lab)
    loss.backward()
    _grads_vs_reference(ns, g, model, loss, ids, lab)


def check_9(ns, g):
    group = ns["make_tp_group"](2)
    expect(group is not None, "make_tp_group must return this rank's group")
    ranks = dist.get_process_group_ranks(group)
    expect(ranks == [2 * (dist.get_rank() // 2), 2 * (dist.get_rank() // 2) + 1],
           f"rank {dist.get_rank()}: TP group {ranks}, expected contiguous ranks")


def check_10(ns, g):
    group = ns["make_dp_group"](2, 2)
    expect(group is not None, "make_dp_group must return this rank's group")
    ranks = dist.get_process_group_ranks(group)
    expect(ranks == [dist.get_rank() % 2, dist.get_rank() % 2 + 2], f"rank {dist.get_rank()}: DP group {ranks}, expected strided ranks")


def check_11(ns, g):
    ids, labels = token_batch(4, 8, CFG.vocab_size, seed=2)
    rows = slice(2 * g["dp_rank"], 2 * g["dp_rank"] + 2)
    model = ns["TPLlama"](Llama(CFG, seed=0), g["tp_group"])
    loss = model.loss(ids[rows], labels[rows])
    loss.backward()
    ns["average_gradients"](model, g["dp_group"])
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
    expect(abs(float(metric) - want) < 1e-9, f"reduce_over_dp: with different numbers on every rank expected {want:.4f} "
           f"(sums over the DP group only), got {metric}: reduce over dp_group, not over all ranks")


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
        for n in range(1, 12):
            try:
                globals()[f"check_{n}"](ns, groups)
                results[str(n)] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the checker
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                results[str(n)] = line if not isinstance(exc, Bad) else f"Bad: {exc}"
        write_record({"results": results})
    finally:
        teardown()
