"""Checkers of tp_fsdp/experts.ipynb (course ``experts``): the load-balancing loss of a mixture of experts.

``load_balancing_loss(router_probs, expert_index, num_experts)`` gets the router's softmax ``[n, E]`` and the
experts chosen ``[n, k]`` and must return Switch Transformer's ``E · Σ_e f_e · P_e``, with ``f_e`` the fraction
of the ``n · k`` routing decisions (all ``k`` choices of every token) that chose ``e`` and ``P_e`` the mean
probability of ``e`` over the tokens. The inputs are chosen so that each common mistake changes the value: top-2
and top-3 (the first choice alone, or counts divided by ``n`` only, differ), numbers of tokens that are not
multiples of ``E`` and ``E`` not a power of two (3, 5, 6, 7), a case with as many tokens as experts (a mean over
the wrong axis then broadcasts silently), an expert that no decision chose (``bincount`` without ``minlength``
is one short), decisions that are not the top-k of the probabilities (as after noisy routing: recomputing them
from the probabilities is wrong), a collapsed routing (the loss must be ``E``), and the gradient with respect to
the probabilities (``E · f_e / n``: the loss must stay differentiable).
"""
from __future__ import annotations

from typing import Callable

import torch

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.parallel.experts import keep_mask, top_k_routing

EXPERTS_NB = "tp_fsdp/experts.ipynb"


def _reference(probs: torch.Tensor, index: torch.Tensor, e: int) -> torch.Tensor:
    counts = torch.zeros(e, dtype=torch.float64)
    counts.index_add_(0, index.reshape(-1), torch.ones(index.numel(), dtype=torch.float64))
    return e * (counts / index.numel() * probs.double().mean(0)).sum()


def _case(g: torch.Generator, n: int, e: int, k: int, dtype: torch.dtype, *, unused_last: bool = False,
          noisy: bool = False, collapsed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(n, e, generator=g, dtype=torch.float64) * 1.5
    logits[:, 0] += 0.8  # a favourite expert: the routing is uneven, f and P far from uniform
    if unused_last:
        logits[:, -1] -= 30.0
    if collapsed:
        logits = torch.full((n, e), -60.0, dtype=torch.float64)
        logits[:, 0] = 0.0
    probs = torch.softmax(logits, -1)
    index = probs.topk(k, -1).indices
    if noisy:  # the decisions come from noisy logits (as in noisy top-k routing): not the top-k of probs
        index = (logits + 3 * torch.randn(n, e, generator=g, dtype=torch.float64)).topk(k, -1).indices
    return probs.to(dtype), index


def _candidates(probs: torch.Tensor, index: torch.Tensor, e: int) -> list[tuple[torch.Tensor, str]]:
    p = probs.double()
    n, k = index.shape
    counts = torch.zeros(e, dtype=torch.float64).index_add_(0, index.reshape(-1), torch.ones(n * k, dtype=torch.float64))
    first = torch.zeros(e, dtype=torch.float64).index_add_(0, index[:, 0], torch.ones(n, dtype=torch.float64))
    want = e * (counts / (n * k) * p.mean(0)).sum()
    out = [
        (want / e, "the loss is not scaled by the number of experts (the factor E): uniform routing must give 1, "
                   "whatever E"),
        (e * (first / n * p.mean(0)).sum(),
         "f counts only the first choice (expert_index[:, 0]): count all k choices of every token, over n · k decisions"),
        (e * (p.mean(0) ** 2).sum(),
         "f is computed from the router probabilities, not counts: f_e is the fraction of the routing decisions "
         "(expert_index) that chose e; the probabilities enter through P only"),
        (e * (counts * p.mean(0)).sum(),
         "f holds raw counts: divide the number of decisions that chose e by the number of decisions, n · k"),
        (e * (counts / (n * k) * p.sum(0)).sum(),
         "P is a sum over the tokens: P_e is the mean probability of e over the tokens (mean over dim 0)"),
    ]
    chosen = torch.zeros(n, e, dtype=torch.float64).scatter_(1, index, 1.0)
    out.append((e * (counts / (n * k) * (p * chosen).mean(0)).sum(),
                "P keeps only the probabilities of the chosen experts: P_e is the mean of router_probs[:, e] over "
                "every token, chosen or not (the softmax before the top-k)"))
    if k > 1:
        out.append((want * k, "f is divided by the number of tokens n: divide by the number of decisions n · k, "
                              "so that the fractions sum to 1"))
    if n == e:
        out.append((e * (counts / (n * k) * p.mean(1)).sum(),
                    "P is a mean over the wrong axis (the experts, dim 1): P_e is the mean over the tokens, dim 0"))
        out.append((e * ((counts / (n * k)).unsqueeze(0) * p).mean(1).sum(),
                    "the product f_e · P_e is averaged over the wrong axis: average the probabilities over the "
                    "tokens (dim 0) first"))
    top = probs.double().topk(k, -1).indices
    if not torch.equal(top.sort(-1).values, index.sort(-1).values):
        tc = torch.zeros(e, dtype=torch.float64).index_add_(0, top.reshape(-1), torch.ones(n * k, dtype=torch.float64))
        out.append((e * (tc / (n * k) * p.mean(0)).sum(),
                    "the routing decisions are recomputed from router_probs (top-k): use expert_index, the decisions "
                    "the router really took (noisy routing, capacity ... make them differ)"))
    return out


def _call(fn: Callable, probs: torch.Tensor, index: torch.Tensor, e: int, where: str) -> torch.Tensor:
    try:
        loss = fn(probs, index, e)
    except NotImplementedError:
        raise
    except (RuntimeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        used = sorted(set(index.reshape(-1).tolist()))
        if len(used) < e and "size" in first:
            raise CheckFailed(f"{where}: it raised {type(exc).__name__} ({first[:120]}) when expert {e - 1} got no "
                              "decision: every expert needs a count, 0 included (bincount's minlength)") from None
        if "must match the size" in first:
            raise CheckFailed(f"{where}: it raised {type(exc).__name__} ({first[:120]}): f and P must both be [E] "
                              "vectors; P_e is a mean over the tokens (dim 0), not over the wrong axis") from None
        raise CheckFailed(f"{where}: it raised {type(exc).__name__}: {first[:160]}") from None
    expect(isinstance(loss, torch.Tensor), f"{where}: return a tensor (a 0-dim loss), got {type(loss).__name__}")
    expect(loss.numel() == 1, f"{where}: return one number (a 0-dim tensor), got shape {tuple(loss.shape)}: sum "
                              "f_e · P_e over the experts")
    return loss


SEEDS = (0, 1)  # two draws of every case: a mistake that one routing hides shows in the other


def _check_gradient(grad: torch.Tensor | None, probs: torch.Tensor, index: torch.Tensor, e: int, where: str) -> None:
    """The gradient must reach router_probs through P only: E · f_e / n for every token, f counted (no gradient)."""
    n = probs.shape[0]
    f = torch.zeros(e, dtype=torch.float64).index_add_(0, index.reshape(-1), torch.ones(index.numel(),
                                                                                        dtype=torch.float64))
    f = f / index.numel()
    want = (e * f / n).expand(n, e)
    expect(grad is not None, f"{where}: no gradient reached router_probs: P must be computed from them")
    g = grad.double()
    if torch.allclose(g, want, rtol=1e-5, atol=1e-9):
        return
    through_f = (e * (f + probs.double().mean(0)) / n).expand(n, e)
    expect(not torch.allclose(g, through_f, rtol=1e-5, atol=1e-9),
           f"{where}: the gradient reaches router_probs through f too: f counts decisions and must carry no "
           "gradient; only P does")
    raise CheckFailed(f"{where}: the gradient with respect to router_probs differs from the expected one (max "
                      f"difference {float((g - want).abs().max()):.3g}): it must reach them through P only")


@register("experts", "balance", ("load_balancing_loss",), EXPERTS_NB)
def _check_balance(load_balancing_loss: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    cases = [  # (where, n tokens, E experts, k, dtype, options)
        ("top-2, 6 tokens, 6 experts, float64", 6, 6, 2, torch.float64, {}),
        ("top-2, 13 tokens, 5 experts, float64", 13, 5, 2, torch.float64, {}),
        ("top-1, 7 tokens, 3 experts, float32", 7, 3, 1, torch.float32, {}),
        ("top-3, 11 tokens, 7 experts, the last one never chosen, float32", 11, 7, 3, torch.float32,
         {"unused_last": True}),
        ("top-2, 9 tokens, 3 experts, decisions from noisy routing, float64", 9, 3, 2, torch.float64, {"noisy": True}),
        ("top-1, every token on expert 0 with probability 1, 10 tokens, 5 experts", 10, 5, 1, torch.float64,
         {"collapsed": True}),
    ]
    for (where, n, e, k, dtype, opts), seed in ((c, seed) for seed in SEEDS for c in cases):
        g.manual_seed(seed)
        where = f"{where}, seed {seed}"
        probs, index = _case(g, n, e, k, dtype, **opts)
        leaf = probs.clone().requires_grad_()
        copy_index = index.clone()
        loss = _call(load_balancing_loss, leaf, copy_index, e, where)
        expect(torch.equal(copy_index, index), f"{where}: do not modify expert_index in place")
        want = _reference(probs, index, e)
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        got = float(loss.detach().double().reshape(()))
        if opts.get("collapsed"):
            expect(abs(got - e) <= 1e-6, f"{where}: the loss is {got:.4g}, it must be E = {e} when every token goes "
                                         f"to one expert with probability 1 (f_0 = P_0 = 1)")
        if abs(got - float(want)) > tol * (1 + abs(float(want))):
            for wrong, why in _candidates(probs, index, e):
                if abs(got - float(wrong)) <= tol * (1 + abs(float(wrong))):
                    raise CheckFailed(f"{where}: {why}")
            raise CheckFailed(f"{where}: the loss is {got:.6g}, expected {float(want):.6g} (a difference of "
                              f"{got - float(want):.3g}): none of the known mistakes gives this value")
        expect(loss.dtype == dtype, f"{where}: keep router_probs' dtype {dtype}, got {loss.dtype}")
        expect(loss.requires_grad and loss.grad_fn is not None,
               f"{where}: the loss does not depend on router_probs any more (detached, .item() or a new tensor): the "
               "router learns to balance through the gradient of P_e")
        loss.reshape(()).backward()
        _check_gradient(leaf.grad, probs, index, e, where)
    with torch.no_grad():  # an evaluation pass: no graph, the same value
        probs, index = _case(g, 9, 5, 2, torch.float32)
        got = _call(load_balancing_loss, probs, index, 5, "under torch.no_grad() (an evaluation pass)")
        want = float(_reference(probs, index, 5))
        expect(abs(float(got) - want) <= 2e-6 * (1 + want),
               f"under torch.no_grad() (an evaluation pass) the loss is {float(got):.6g}, expected {want:.6g}")
    return ("E · Σ f_e · P_e with f over the n · k decisions of all k choices and P the mean probability: right for "
            "top-1, 2 and 3, E = 3 to 7, an unused expert, noisy decisions, a collapsed routing (= E), and its gradient")


# ----------------------------------------------------------------------------------------------------
# Top-k routing with renormalisation and capacity
# ----------------------------------------------------------------------------------------------------
def _routing_probs(g: torch.Generator, n: int, e: int, dtype: torch.dtype, ties: bool) -> torch.Tensor:
    logits = torch.randn(n, e, generator=g, dtype=torch.float64) * 1.5
    logits[:, 0] += 1.0  # a favourite expert: capacities overflow, the priority order matters
    probs = torch.softmax(logits, -1)
    if ties:  # exact ties: uniform rows, and rows whose two best are equal
        probs[0] = 1.0 / e
        probs[1] = torch.tensor([0.3, 0.3] + [0.4 / (e - 2)] * (e - 2), dtype=torch.float64).flip(0)
        probs[2, :] = probs[1]
    return probs.to(dtype)


def _keep_candidates(index: torch.Tensor, e: int, cap: int) -> list[tuple[torch.Tensor, str]]:
    n, k = index.shape
    flat = index.reshape(-1)  # token-major: token 0's choices, then token 1's ...
    pos = (torch.nn.functional.one_hot(flat, e).cumsum(0) * torch.nn.functional.one_hot(flat, e)).sum(-1) - 1
    right = keep_mask(index, e, cap)
    return [
        ((pos < cap).reshape(n, k), "the priority order is token by token (all of token 0's choices, then token 1's "
                                    "...): every token's first choice must be served before any second choice"),
        (keep_mask(index, e, cap + 1), f"an expert keeps one decision too many: it takes at most cap = {cap}"),
        (keep_mask(index, e, cap - 1) if cap > 1 else torch.zeros_like(right),
         f"an expert keeps one decision too few: it takes cap = {cap}"),
        (torch.ones_like(right), "the capacity is not applied: decisions past an expert's capacity must be dropped"),
        (right.all(-1, keepdim=True).expand(n, k), "whole tokens are dropped: the capacity drops decisions, one "
                                                   "choice of a token can be kept while another is dropped"),
        (keep_mask(index.flip(0), e, cap).flip(0), "the decisions are served from the last token: in token order, "
                                                   "first tokens first"),
    ]


def _check_route(route_tokens: Callable, where: str, probs: torch.Tensor, k: int, cap: int | None) -> None:
    want_index, want_weights, want_keep = top_k_routing(probs.double(), k, cap)
    leaf = probs.clone().requires_grad_()
    try:
        got = route_tokens(leaf, k, cap)
    except NotImplementedError:
        raise
    except (RuntimeError, IndexError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckFailed(f"{where}: it raised {type(exc).__name__}: {first[:160]}") from None
    expect(isinstance(got, tuple) and len(got) == 3, f"{where}: return (expert_index, weights, keep)")
    index, weights, keep = got
    n, e = probs.shape
    expect(tuple(index.shape) == (n, k) and tuple(weights.shape) == (n, k) and tuple(keep.shape) == (n, k),
           f"{where}: expert_index, weights and keep must each be [n, k] = [{n}, {k}], got {tuple(index.shape)}, "
           f"{tuple(weights.shape)}, {tuple(keep.shape)}")
    expect(not index.is_floating_point() and keep.dtype == torch.bool and weights.dtype == probs.dtype,
           f"{where}: expert_index must hold integers, keep booleans, weights the probabilities' dtype {probs.dtype}")
    expect(torch.equal(leaf.detach(), probs), f"{where}: do not modify probs in place")
    index = index.long()
    if not torch.equal(index, want_index):
        same_sets = torch.equal(index.sort(-1).values, want_index.sort(-1).values)
        tie_rows = (probs.double().gather(1, want_index).unsqueeze(-1) ==
                    probs.double().unsqueeze(1)).sum((1, 2)) > k
        differ = (index != want_index).any(-1)
        expect(not bool((differ & ~tie_rows).any()) or not same_sets,
               f"{where}: the k choices of a token are not in decreasing order of probability: the first choice is "
               "the most probable expert (the capacity serves first choices first)")
        expect(bool((differ & ~tie_rows).any()), f"{where}: equal probabilities are not broken the stated way: among "
                                                 "equal probabilities the lower expert index comes first")
        raise CheckFailed(f"{where}: the chosen experts are not the k most probable ones of each token")
    if not torch.allclose(weights.detach().double(), want_weights, rtol=1e-6, atol=1e-9):
        top = probs.double().gather(1, want_index)
        kept_top = top * keep.double()
        candidates = [
            (top, "the weights are not renormalised: the k weights of a token must sum to 1"),
            (torch.softmax(top, -1), "the weights are a softmax of the top-k probabilities, not their renormalisation: "
                                     "each weight must keep its probability's proportion to the others"),
            (kept_top / kept_top.sum(-1, keepdim=True).clamp_min(1e-300),
             "the weights are renormalised again over the kept choices: the capacity drops decisions, it does not "
             "change the weights of those kept"),
        ]
        for wrong, why in candidates:
            expect(not torch.allclose(weights.detach().double(), wrong, rtol=1e-6, atol=1e-9), f"{where}: {why}")
        raise CheckFailed(f"{where}: the weights differ from the renormalised top-k probabilities by "
                          f"{float((weights.detach().double() - want_weights).abs().max()):.3g}")
    expect(weights.requires_grad and weights.grad_fn is not None,
           f"{where}: the weights do not depend on probs any more (detached or rebuilt): the router learns through them")
    _check_route_gradient(weights, leaf, probs, want_index, where)
    if not torch.equal(keep, want_keep):
        for wrong, why in _keep_candidates(want_index, e, cap) if cap is not None else []:
            expect(not torch.equal(keep, wrong), f"{where}: {why}")
        raise CheckFailed(f"{where}: {int((keep != want_keep).sum())} decisions kept or dropped differently from the "
                          "stated rule")


def _check_route_gradient(weights: torch.Tensor, leaf: torch.Tensor, probs: torch.Tensor, index: torch.Tensor,
                          where: str) -> None:
    """The router's gradient: the student's weights and the reference's, both pulled back from the same seeded
    upstream gradient, must give the same gradient with respect to probs (values alone do not show a normaliser
    computed without autograd: the same numbers, a gradient that misses the part through the sum)."""
    upstream = torch.randn(weights.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    try:
        (weights * upstream.to(weights.dtype)).sum().backward()
    except RuntimeError as exc:
        raise CheckFailed(f"{where}: backward through the weights failed: {str(exc).splitlines()[0][:160]}") from None
    ref_leaf = probs.detach().double().clone().requires_grad_()
    _, ref_weights, _ = top_k_routing(ref_leaf, index.shape[1])
    (ref_weights * upstream).sum().backward()
    want, got = ref_leaf.grad, leaf.grad
    expect(got is not None, f"{where}: no gradient reached probs through the weights")
    tol = 1e-9 if probs.dtype == torch.float64 else 1e-5  # float32: a few roundings of numbers of order 1
    diff = float((got.double() - want).abs().max())
    if diff <= tol:
        return
    top = probs.double().gather(1, index)
    frozen = torch.zeros_like(want).scatter_(1, index, upstream / top.sum(-1, keepdim=True))  # the sum detached
    expect(not torch.allclose(got.double(), frozen, rtol=0, atol=tol),
           f"{where}: the weights' values are right but their gradient with respect to probs is not (max difference "
           f"{diff:.3g}): the normaliser, the sum of a token's k probabilities, carries no gradient (detached, "
           "computed under no_grad or from Python numbers); the router also learns through it")
    raise CheckFailed(f"{where}: the weights' values are right but their gradient with respect to probs differs from "
                      f"the renormalised top-k probabilities' by up to {diff:.3g} (an upstream gradient of seeded "
                      "random numbers pulled back through both)")


#: (where, tokens, experts, k, capacity, dtype, ties)
ROUTING_CASES = [
    ("top-2 of 5 experts, 7 tokens, no capacity, float64", 7, 5, 2, None, torch.float64, False),
    ("top-2 of 6 experts, 11 tokens, capacity 3, float64", 11, 6, 2, 3, torch.float64, False),
    ("top-1 of 3 experts, 9 tokens, capacity 2, float32", 9, 3, 1, 2, torch.float32, False),
    ("top-3 of 7 experts, 13 tokens, capacity 4, float64", 13, 7, 3, 4, torch.float64, False),
    ("top-2 of 5 experts, 9 tokens with tied probabilities, capacity 3, float64", 9, 5, 2, 3, torch.float64, True),
]


@register("experts", "routing", ("route_tokens",), EXPERTS_NB)
def _check_routing(route_tokens: Callable) -> str:
    g = torch.Generator()
    for seed in SEEDS:
        g.manual_seed(seed)
        for where, n, e, k, cap, dtype, ties in ROUTING_CASES:
            _check_route(route_tokens, f"{where}, seed {seed}", _routing_probs(g, n, e, dtype, ties), k, cap)
    return ("the k most probable experts in order, ties to the lower index, weights renormalised over the k choices "
            "(the same gradient with respect to probs), capacity by priority (first choices first, in token order): equal to the library's "
            "top_k_routing on odd sizes, k = 1 to 3, with ties")
