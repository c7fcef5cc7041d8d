"""Balises 5-8 on real peers: the parallel MLP and attention, the whole TP Llama and the vocabulary-parallel
cross-entropy, on the generated cases of :mod:`.draw` (tp = 2 on a strided group, 4, 3 on a subset, 1; float32 and
float64 for the modules), the output, the input's gradient AND every parameter's gradient compared with the single-
process module's. Each ``check_<n>(ns, g)`` raises :class:`dlo.course.tp_cases.Bad` naming the mistake and the case.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlo.course.tp_cases import (CFG, _grads_vs_reference, close, counted, expect, precision_hint, seeded,
                                 sum_hint)
from dlo.course.tp_cases.draw import attention_shape, plan, settings, sizes
from dlo.course.tp_cases.layers import build, where
from dlo.models.config import TransformerConfig
from dlo.models.llama import Attention, Llama, SwiGLU, rotary_cos_sin, token_batch
from dlo.parallel import comm

#: The Llama of balise 7 on the settings tp = 2, 4 and 3 (the last one with its head tied to the embedding); every
#: size a multiple of its tp, the vocabulary, hidden and intermediate sizes (and their slices) all different.
LLAMAS = (CFG,
          TransformerConfig(vocab_size=96, hidden_size=20, intermediate_size=48, num_layers=1, num_heads=8,
                            num_kv_heads=4, head_dim=4),
          TransformerConfig(vocab_size=63, hidden_size=24, intermediate_size=45, num_layers=1, num_heads=6,
                            num_kv_heads=3, tie_embeddings=True))


def _param_grads(name, s, at, layer, full):
    """Every parameter's gradient equals this rank's slice of the full module's (split along the one dimension
    whose size differs, chunk r), or the whole of it when the parameter is replicated."""
    mine = dict(layer.named_parameters())
    for pname, p in full.named_parameters():
        q = mine.get(pname)
        expect(q is not None, at + f"{name}: no parameter {pname} on this rank: keep the full module's parameter names")
        if q.shape == p.shape:
            want = p.grad
        else:
            dims = [d for d in range(p.ndim) if q.shape[d] * s.tp == p.shape[d]]
            want = p.grad.chunk(s.tp, dim=dims[0])[s.r] if dims else None
        expect(q.grad is not None and close(q.grad, want), at + f"{name}: the gradient of {pname} differs from this "
               "rank's slice of the single-process module's")


def _module_case(ns, s, at, name, full, x, *extra):
    layer = build(ns, name, s, at, full)
    one = int(s.tp > 1)
    comm.COUNTER.reset()
    xin = x.clone().requires_grad_()
    y = layer(xin, *extra)
    fwd_counts = counted()
    expect(comm.COUNTER.calls("all_reduce", "forward") == one and comm.COUNTER.calls() == one,
           at + f"{name}: expected exactly {one} all-reduce in the forward (column-parallel in, row-parallel out: no "
                f"gather), counted {fwd_counts}")
    local, whole = sum(p.numel() for p in layer.parameters()), sum(p.numel() for p in full.parameters())
    expect(local * s.tp == whole, at + f"{name}: {local} parameters on this rank, expected {whole} / tp = "
           f"{whole // s.tp}: split every weight over the group you are given (tp={s.tp}), not over every rank, and "
           "replicate none")
    xr = x.clone().requires_grad_()
    ref = full(xr, *extra)
    expect(y.dtype == ref.dtype, at + f"{name}: the output is {str(y.dtype).replace('torch.', '')} for a module in "
           f"{str(ref.dtype).replace('torch.', '')}: keep its dtype (a buffer made without dtype= is float32)")
    expect(close(y, ref), at + f"{name}: output differs from the single-process module" + sum_hint(y, ref, s.tp)
           + precision_hint(y, ref))
    w = seeded(*ref.shape, seed=5).to(ref.dtype)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    expect(close(xin.grad, xr.grad), at + f"{name}: the input gradient differs from the single-process one (f, "
           "copy_to_region, applied once to the input, sums the ranks' parts of it)")
    fwd, bwd = comm.COUNTER.calls("all_reduce", "forward"), comm.COUNTER.calls("all_reduce", "backward")
    expect(fwd == one and bwd == one and comm.COUNTER.calls() == 2 * one,
           at + f"{name}: expected exactly {one} all-reduce forward and {one} backward, counted {counted()} "
                "(apply copy_to_region once, copy_input=False on the column-parallel layers)")
    _param_grads(name, s, at, layer, full)


def check_5(ns, g):
    for s, dtype, seed in plan(settings(g["rank"], g)):
        size = sizes(s.tp, seed)
        torch.manual_seed(seed)
        full = SwiGLU(size["hidden"], size["ffn"]).to(dtype)
        at = where(s, dtype, f"SwiGLU(hidden {size['hidden']}, intermediate {size['ffn']})")
        _module_case(ns, s, at, "ParallelSwiGLU", full, seeded(2, 5, size["hidden"], seed=seed).to(dtype))


def _attention_cases(s, dtype, seed):
    """The fixed cases at tp = 2 in float32 (num_heads * head_dim != hidden, two K/V heads per rank with two query
    heads each) and a drawn one in every case."""
    fixed = [(16, 4, 2, 4), (20, 8, 4, 4)] if s.tp == 2 and dtype == torch.float32 else []
    hidden = sizes(s.tp, seed)["hidden"] + 1  # even or odd, never the drawn heads' width (attention_shape sees to it)
    return fixed + [(hidden, *attention_shape(s.tp, seed, hidden))]


def check_6(ns, g):
    for s, dtype, seed in plan(settings(g["rank"], g)):
        for hidden, heads, kv, head_dim in _attention_cases(s, dtype, seed):
            torch.manual_seed(seed)
            cos, sin = (t.to(dtype) for t in rotary_cos_sin(5, head_dim))
            at = where(s, dtype, f"hidden {hidden}, {heads} heads / {kv} K/V heads of {head_dim}")
            full = Attention(hidden, heads, kv, head_dim).to(dtype)
            _module_case(ns, s, at, "ParallelAttention", full, seeded(2, 5, hidden, seed=seed).to(dtype), cos, sin)
        for heads, kv in ((s.tp + 1, s.tp + 1), (2 * s.tp, 1)):  # tp divides the widths but not the heads
            raised = s.tp == 1  # (tp = 1 divides everything; the expect below is still made by every process)
            try:
                if s.tp > 1:
                    ns["ParallelAttention"](Attention(12, heads, kv, 2 * s.tp), s.group)
            except ValueError:
                raised = True
            expect(raised, where(s, dtype) + f"ParallelAttention with {heads} heads / {kv} K/V heads must raise "
                   f"ValueError (tp must divide num_heads and num_kv_heads: dividing the projections' widths is not "
                   "enough)")


def check_7(ns, g):
    for s, cfg in zip(settings(g["rank"], g)[:3], LLAMAS):
        at = where(s, torch.float32, f"Llama(vocab {cfg.vocab_size}, hidden {cfg.hidden_size}, intermediate "
                                     f"{cfg.intermediate_size}, {cfg.num_heads} heads / {cfg.num_kv_heads} K/V of "
                                     f"{cfg.head_dim}{', tied head' if cfg.tie_embeddings else ''})")
        ids, labels = token_batch(2, 8, cfg.vocab_size, seed=1)
        full = Llama(cfg, seed=0)
        whole = sum(p.numel() for p in full.parameters())
        norms = sum(p.numel() for n, p in full.named_parameters() if "norm" in n)
        model = build(ns, "TPLlama", s, at, full)
        local, want = sum(p.numel() for p in model.parameters()), (whole - norms) // s.tp + norms
        expect(local == want, at + f"TPLlama: {local} parameters on this rank, expected {want}: split embed_tokens, "
               "every block and lm_head over the group; only the norms are replicated")
        expect(close(model(ids), Llama(cfg, seed=0)(ids)), at + "TPLlama: gathered logits differ from the single-"
                                                                "process model")
        loss = model.loss(ids, labels, vocab_parallel=False)
        loss.backward()
        _grads_vs_reference(ns, s.group, model, loss, ids, labels, cfg=cfg, where=at)


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


def _ce_variant(logits, labels, tp, *, own_max=False, target_everywhere=False, times=1):
    """The loss a vocab-parallel cross-entropy with one named mistake returns at ``tp`` (computed whole here)."""
    z, lab = logits.reshape(-1, logits.shape[-1]).double(), labels.reshape(-1)
    n, total, target = z.shape[-1] // tp, 0.0, 0.0
    for k in range(tp):
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


def _ce_hint(loss, logits, labels, tp):
    for kwargs, words in _CE_MISTAKES:
        if (tp == 2 or "times" not in kwargs) and abs(float(loss) - _ce_variant(logits, labels, tp, **kwargs)) < 1e-5:
            return f" -- {words}"
    return ""


def _ce_case(ns, s, dtype, seed):
    tp, r = s.tp, s.r
    vocab = 10 if seed == 1 else sizes(tp, seed)["vocab"]
    n, at = vocab // tp, where(s, dtype, f"vocabulary {vocab}")
    logits = (seeded(2, 6, vocab, seed=7 + seed) * (1 + seed % 3)).to(dtype).requires_grad_()
    labels = torch.tensor([[0, vocab - 1, n - 1, n % vocab, -100, vocab // 2],
                           [(tp - 1) * n, 3 % vocab, 1, vocab - 2, 2, (tp - 1) * n - 1 if tp > 1 else 5 % vocab]])
    local = logits.detach()[..., r * n:(r + 1) * n].clone().requires_grad_()
    comm.COUNTER.reset()
    with _counting_gathers() as gathers:  # torch.distributed's own gathers too, not only the workbook's
        loss = ns["vocab_parallel_cross_entropy"](local, labels, s.group)
    ref = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100)
    expect(not gathers, at + f"vocab_parallel_cross_entropy must not gather the logits (it called {', '.join(gathers)})")
    expect(abs(float(loss) - float(ref)) < 1e-5, at + f"vocab-parallel loss {float(loss):.6f} != F.cross_entropy "
           f"{float(ref):.6f}" + _ce_hint(loss, logits.detach(), labels, tp))
    loss.backward()
    ref.backward()
    expect(close(local.grad, logits.grad[..., r * n:(r + 1) * n], 1e-5), at + "vocab_parallel_cross_entropy: wrong "
           "gradient of the local logits (use reduce_from_region for the sums so that autograd reaches every rank)")
    expect(comm.COUNTER.calls("all_gather") == 0, at + "vocab_parallel_cross_entropy must not gather the logits")
    big = (seeded(2, 6, vocab, seed=8 + seed) * 5 + 100).to(dtype)  # exp(100) overflows float32
    with torch.no_grad():
        loss = ns["vocab_parallel_cross_entropy"](big[..., r * n:(r + 1) * n].clone(), labels, s.group)
    ref = F.cross_entropy(big.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100)
    expect(bool(torch.isfinite(loss)) and abs(float(loss) - float(ref)) < 1e-4,
           at + f"vocab_parallel_cross_entropy with logits near 100: {float(loss)} instead of {float(ref):.5f} -- exp "
                "overflows: subtract the global max (all-reduced with MAX) before exp" + _ce_hint(loss, big, labels, tp))


def check_8(ns, g):
    sets = settings(g["rank"], g)
    for s, dtype, seed in plan(sets):
        _ce_case(ns, s, dtype, seed)
    tp2 = sets[0]
    ids, lab = token_batch(2, 8, CFG.vocab_size, seed=1)
    model = ns["TPLlama"](Llama(CFG, seed=0), tp2.group)
    loss = model.loss(ids, lab)
    loss.backward()
    _grads_vs_reference(ns, tp2.group, model, loss, ids, lab, where=where(tp2, torch.float32, "the TP Llama's loss"))
