"""Checkers of Jour3/optimizers.ipynb (course ``optimizers``). The JIT notebook's are in :mod:`dlo.checks_jit`."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.training.optim import Lion

OPTIM_NB = "Jour3/optimizers.ipynb"


@register("optimizers", "warmup", ("warmup_cosine_lr",), OPTIM_NB)
def _check_warmup(warmup_cosine_lr: Callable) -> str:
    def expected(step: int, total: int, warmup: int, base: float) -> float:
        if step < warmup:
            return base * (step + 1) / warmup
        return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    for total, warmup, base in ((100, 10, 0.1), (50, 1, 2.0), (1000, 100, 3e-4)):
        for step in sorted({0, 1, warmup - 1, warmup, warmup + 1, total // 2, total - 1}):
            got = warmup_cosine_lr(step, total, warmup, base)
            want = expected(step, total, warmup, base)
            expect(isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want)),
                    f"step {step} of {total} (warm-up {warmup}, base {base}): expected {want:.6g}, got {got!r}")
    return "linear warm-up to the base rate, then a cosine down to 0"


def _lion_inputs(g: torch.Generator, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p, grad, m where sign(m), sign(g) and sign(beta1 * m + (1 - beta1) * g) disagree on many coordinates."""
    p0 = torch.randn(*shape, generator=g)
    m0 = torch.randn(*shape, generator=g)
    grad = -m0 * (1 + 200 * torch.rand(*shape, generator=g))  # opposite to m, 1 to 201 times larger
    flip = torch.rand(*shape, generator=g) < 0.3  # and on some coordinates the same sign as m
    grad = torch.where(flip, -grad, grad)
    return p0, grad, m0


@register("optimizers", "lion", ("lion_update",), OPTIM_NB)
def _check_lion(lion_update: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    for wd, (lr, beta1, beta2), shape in ((0.0, (0.01, 0.9, 0.99), (5, 7)), (0.1, (0.003, 0.8, 0.95), (6, 4))):
        p0, grad, m0 = _lion_inputs(g, shape)
        inputs = [t.clone() for t in (p0, grad, m0)]
        new_p, new_m = lion_update(*inputs, lr, beta1, beta2, wd)
        expect(all(torch.equal(a, b) for a, b in zip(inputs, (p0, grad, m0))),
               "do not modify p, g or m in place: return new tensors")
        expect(isinstance(new_p, torch.Tensor) and new_p.shape == p0.shape, "return (new_p, new_m), two tensors shaped like p")
        ref = nn.Parameter(p0.clone())
        opt = Lion([ref], lr=lr, betas=(beta1, beta2), weight_decay=wd)
        opt.state[ref]["exp_avg"] = m0.clone()
        ref.grad = grad.clone()
        opt.step()
        if not torch.allclose(new_p, ref.detach(), atol=1e-7):
            decayed = p0 * (1 - lr * wd)
            step = (decayed - new_p) / lr  # what your update did, in units of lr
            why = ""
            if torch.allclose(step, torch.sign(m0), atol=1e-4):
                why = ": you took sign(m), the old momentum; Lion steps along sign(beta1 * m + (1 - beta1) * g)"
            elif torch.allclose(step, torch.sign(grad), atol=1e-4):
                why = ": you took sign(g); Lion steps along sign(beta1 * m + (1 - beta1) * g)"
            elif torch.allclose(step, torch.sign(beta2 * m0 + (1 - beta2) * grad), atol=1e-4):
                why = ": the direction mixes m and g with beta2; it uses beta1 (beta2 is for the momentum update)"
            elif torch.allclose(new_p, p0 - lr * torch.sign(beta1 * m0 + (1 - beta1) * grad), atol=1e-7):
                why = f": the weight decay is missing (weight_decay={wd}): multiply p by (1 - lr * weight_decay)"
            raise CheckFailed(f"weights differ from dlo.training.optim.Lion (lr={lr}, betas=({beta1}, {beta2}), "
                              f"weight_decay={wd}){why or ': p * (1 - lr * wd) - lr * sign(beta1 * m + (1 - beta1) * g)'}")
        if not torch.allclose(new_m, opt.state[ref]["exp_avg"], atol=1e-7):
            why = (" (you used beta1: the momentum uses beta2)"
                   if torch.allclose(new_m, beta1 * m0 + (1 - beta1) * grad, atol=1e-7) else "")
            raise CheckFailed(f"momentum differs: beta2 * m + (1 - beta2) * g{why}")
    return "same weights and momentum as dlo.training.optim.Lion (two sets of hyper-parameters, with and without weight decay)"


@register("optimizers", "accumulate", ("accumulated_backward",), OPTIM_NB)
def _check_accumulate(accumulated_backward: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    criterion = nn.CrossEntropyLoss()
    criterion(model(x), y).backward()
    big = [p.grad.clone() for p in model.parameters()]
    for k in (3, 4):  # 4 does not divide 30: the micro-batches have different sizes
        model.zero_grad(set_to_none=True)
        total = accumulated_backward(model, criterion, x, y, k)
        expect(all(p.grad is not None for p in model.parameters()), "call backward() on every micro-batch's loss")
        for p, ref in zip(model.parameters(), big):
            if not torch.allclose(p.grad, ref, atol=1e-6):
                ratio = (p.grad.norm() / ref.norm()).item()
                raise CheckFailed(f"k={k}: the summed gradients are {ratio:.2f} x the big batch's: weight each "
                                  "micro-batch's loss by len(micro_batch) / len(images)")
        with torch.no_grad():
            full = criterion(model(x), y).item()
        expect(isinstance(total, float) and abs(total - full) < 1e-5,
                f"return the total loss as a float ({full:.4f} here), got {total!r}")
    return "k micro-batches give the big batch's gradient (weighted by their size), no optimizer step"
