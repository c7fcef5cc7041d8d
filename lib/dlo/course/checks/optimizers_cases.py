"""Generated cases of the optimizers checkers (Jour3/optimizers.ipynb): the warm-up schedule, the Lion update and
gradient accumulation, each run against an independent reference on seeded cases (:mod:`dlo.course.checks.cases`).

- warmup: schedules with warm-ups of 1 and of odd lengths, a total one step past the warm-up, several base rates;
  on each, step 0, both sides of the warm-up's end, the middle and the last step.
- lion: float32 and float64, shapes from a scalar to 3-d, learning rates, betas and weight decays (0 included),
  1 to 3 chained steps compared with :class:`dlo.training.optim.Lion`, interpolations that are exactly 0 (sign 0).
- accumulate: 1 to 30 samples, k from 1 to the batch size (k dividing it or not, and k for which ``chunk`` gives
  fewer than k pieces), float32 and float64 models with a frozen layer and an unused parameter (no gradient).
- finder_restore: float32 and float64 models with BatchNorm (one frozen in eval mode), dropout and a frozen bias
  (no gradient, no optimizer state), two param groups with their own lr and weight decay; SGD with momentum, Adam
  with and without amsgrad, AdamW; no scheduler, StepLR or a warm-up LambdaLR; gradients left over or none; steps
  that clear the gradients to None or to zeros in place. The reference is a twin that never ran the finder.

A known mistake is named only when the answer gives what its formula gives on every case tried; otherwise the
message states the smallest failing case and the difference.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.cases import Case, compare, run_student, seeded
from dlo.course.checks.framework import CheckFailed
from dlo.training.optim import Lion

# --------------------------------------------------------------------------------------------------
# warmup
# --------------------------------------------------------------------------------------------------


def warmup_reference(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def _warm(decay: Callable[[int, int, int], float]) -> Callable[[int, int, int, float], float]:
    """The right warm-up followed by ``decay(step, total, warmup)`` (a fraction of base)."""
    return lambda s, t, w, b: b * (s + 1) / w if s < w else b * decay(s, t, w)


WARMUP_MISTAKES: list[tuple[str, Callable[[int, int, int, float], float]]] = [
    ("that is a linear decay after the warm-up: the rate follows half a cosine",
     _warm(lambda s, t, w: 1 - (s - w) / (t - w))),
    ("the cosine's progress is counted from step 0 over total_steps: it starts at the end of the warm-up, "
     "(step - warmup_steps) / (total_steps - warmup_steps)", _warm(lambda s, t, w: 0.5 * (1 + math.cos(math.pi * s / t)))),
    ("the cosine's progress is not shifted by the warm-up: it is (step - warmup_steps) / (total_steps - warmup_steps)",
     _warm(lambda s, t, w: 0.5 * (1 + math.cos(math.pi * s / (t - w))))),
    ("that is a full cosine period (the rate climbs back to base_lr): half a period, cos(pi * progress)",
     _warm(lambda s, t, w: 0.5 * (1 + math.cos(2 * math.pi * (s - w) / (t - w))))),
    ("the warm-up starts at 0 (step / warmup_steps): step 0 must already use base_lr / warmup_steps, "
     "(step + 1) / warmup_steps",
     lambda s, t, w, b: b * s / w if s < w else warmup_reference(s, t, w, b)),
]


def warmup_cases() -> list[Case]:
    def schedule(rng: random.Random) -> tuple[int, int, float]:
        warmup = rng.choice([1, 2, 3, 5, 7, 9, 16, 33])
        return warmup + rng.randint(1, 60), warmup, rng.choice([0.1, 2.0, 3e-4, 1.0, 0.05])

    fixed = [(2, 1, 0.5), (7, 3, 1.0), (12, 11, 0.3), (50, 1, 2.0), (100, 10, 0.1), (1000, 100, 3e-4)]
    drawn = [schedule(random.Random(1000 + i)) for i in range(6)]
    cases = []
    for total, warmup, base in fixed + drawn:
        steps = {0, 1, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1,
                 random.Random(total * 31 + warmup).randrange(total)}
        for step in sorted(s for s in steps if 0 <= s < total):
            cases.append(Case(f"step {step} of {total} (warm-up {warmup}, base {base})",
                              dict(step=step, total=total, warmup=warmup, base=base), size=total + step / 1e4))
    return sorted(cases, key=lambda c: c.size)


def check_warmup(fn: Callable) -> int:
    cases = warmup_cases()
    call = lambda f, kw: f(kw["step"], kw["total"], kw["warmup"], kw["base"])  # noqa: E731 - positional, any names
    got = [run_student(fn, c, call) for c in cases]
    for case, value in zip(cases, got):
        problem = compare(value, warmup_reference(**case.kwargs), "the learning rate", dtype=torch.float64)
        if not problem:
            continue
        for why, wrong in WARMUP_MISTAKES:
            if all(compare(v, wrong(*c.kwargs.values()), "", dtype=torch.float64) is None for c, v in zip(cases, got)):
                raise CheckFailed(f"with {case.label}: {problem} -- {why}")
        raise CheckFailed(f"with {case.label}: {problem} (a linear ramp (step + 1) / warmup_steps, then half a "
                          "cosine from base_lr down to 0 over the remaining steps)")
    return len(cases)


# --------------------------------------------------------------------------------------------------
# lion
# --------------------------------------------------------------------------------------------------


def _lion_case(rng: random.Random) -> Case:
    dtype = rng.choice([torch.float32, torch.float64])
    shape = rng.choice([(), (1,), (5, 7), (6, 4), (3, 1, 4), (13,)])
    lr, wd = rng.choice([0.01, 3e-3, 0.1]), rng.choice([0.0, 0.1, 1.0])
    beta1, beta2 = rng.choice([(0.9, 0.99), (0.8, 0.95), (0.5, 0.999)])
    steps = rng.randint(1, 3)
    return _lion(shape, dtype, lr, beta1, beta2, wd, steps, seed=rng.randint(0, 10 ** 6))


def _lion(shape, dtype, lr, beta1, beta2, wd, steps, *, seed: int, zero_c: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(shape, generator=g, dtype=torch.float64)
    m = torch.randn(shape, generator=g, dtype=torch.float64)
    grads = []
    for _ in range(steps):  # gradients that often disagree in sign with m, 1 to 201 times larger
        grad = -m * (1 + 200 * torch.rand(shape, generator=g, dtype=torch.float64))
        grads.append(torch.where(torch.rand(shape, generator=g, dtype=torch.float64) < 0.3, -grad, grad).to(dtype))
    if zero_c:  # momentum 0 (the first step) and some gradients exactly 0: c = 0 there, and sign(0) = 0
        m = torch.zeros(shape, dtype=torch.float64)
        grads[0] = torch.where(torch.rand(shape, generator=g) < 0.5, torch.zeros_like(grads[0]), grads[0])
    label = (f"{str(dtype).replace('torch.', '')}, shape {tuple(shape)}, lr={lr}, betas=({beta1}, {beta2}), "
             f"weight_decay={wd}, {steps} step(s)" + (", momentum 0 and some gradients 0" if zero_c else ""))
    kwargs = dict(p=p.to(dtype), m=m.to(dtype), grads=grads, lr=lr, beta1=beta1, beta2=beta2, wd=wd)
    return Case(label, kwargs, size=steps * 100 + (math.prod(shape) if shape else 1))


def lion_cases() -> list[Case]:
    fixed = [_lion((5, 7), torch.float32, 0.01, 0.9, 0.99, 0.0, 1, seed=0),
             _lion((6, 4), torch.float32, 3e-3, 0.8, 0.95, 0.1, 1, seed=1),
             _lion((4, 3), torch.float64, 0.1, 0.9, 0.99, 1.0, 1, seed=2, zero_c=True),
             _lion((9,), torch.float64, 0.05, 0.9, 0.99, 0.5, 2, seed=3)]
    return seeded(_lion_case, 8, seed=4, fixed=fixed)


def lion_reference(p, m, grads, lr, beta1, beta2, wd) -> tuple[torch.Tensor, torch.Tensor]:
    param = nn.Parameter(p.clone())
    opt = Lion([param], lr=lr, betas=(beta1, beta2), weight_decay=wd)
    opt.state[param]["exp_avg"] = m.clone()
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    return param.detach(), opt.state[param]["exp_avg"]


def _lion_one_step_mistakes(p, m, g, lr, beta1, beta2, wd) -> list[tuple[str, torch.Tensor]]:
    decayed = p * (1 - lr * wd)
    return [
        ("you took sign(m), the old momentum; Lion steps along sign(beta1 * m + (1 - beta1) * g)",
         decayed - lr * torch.sign(m)),
        ("you took sign(g); Lion steps along sign(beta1 * m + (1 - beta1) * g)", decayed - lr * torch.sign(g)),
        ("the direction mixes m and g with beta2; it uses beta1 (beta2 is for the momentum update)",
         decayed - lr * torch.sign(beta2 * m + (1 - beta2) * g)),
        ("the weight decay is missing: multiply p by (1 - lr * weight_decay)",
         p - lr * torch.sign(beta1 * m + (1 - beta1) * g)),
    ]


def check_lion(fn: Callable) -> int:
    cases = lion_cases()

    def chain(f, kw):
        p, m = kw["p"], kw["m"]
        for grad in kw["grads"]:
            inputs = [p.clone(), grad.clone(), m.clone()]
            out = f(*inputs, kw["lr"], kw["beta1"], kw["beta2"], kw["wd"])
            if not all(torch.equal(a, b) for a, b in zip(inputs, (p, grad, m))):
                raise CheckFailed("p, g or m was modified in place: return new tensors (new_p, new_m)")
            if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
                raise CheckFailed("return (new_p, new_m), two tensors shaped like p")
            p, m = out
        return p, m

    for case in cases:
        got, want = run_student(fn, case, chain), lion_reference(**case.kwargs)
        problem = compare(got[0], want[0], "new_p") or compare(got[1], want[1], "new_m")
        if problem:
            raise CheckFailed(f"with {case.label}: {problem}{_lion_why(fn, cases, chain, problem)}")
    return len(cases)


def _lion_why(fn: Callable, cases: list[Case], chain: Callable, problem: str) -> str:
    """The known mistake whose formula the answer follows on the first step of every case, if any."""
    one = [Case(c.label, {**c.kwargs, "grads": c.kwargs["grads"][:1]}) for c in cases]
    got = [run_student(fn, c, chain) for c in one]
    args = [(c.kwargs["p"], c.kwargs["m"], c.kwargs["grads"][0], c.kwargs["lr"], c.kwargs["beta1"], c.kwargs["beta2"],
             c.kwargs["wd"]) for c in one]
    if problem.startswith("new_m"):
        beta1_m = [a[4] * a[1] + (1 - a[4]) * a[2] for a in args]
        if all(compare(g[1], b, "") is None for g, b in zip(got, beta1_m)):
            return " -- you used beta1: the momentum uses beta2"
        return " -- the momentum is beta2 * m + (1 - beta2) * g"
    names = [why for why, _ in _lion_one_step_mistakes(*args[0])]
    for i, why in enumerate(names):
        wrong = [_lion_one_step_mistakes(*a)[i][1] for a in args]
        if all(compare(g[0], w, "") is None for g, w in zip(got, wrong)):
            return f" -- {why}"
    return " (p * (1 - lr * weight_decay) - lr * sign(beta1 * m + (1 - beta1) * g), where sign(0) = 0)"


# --------------------------------------------------------------------------------------------------
# accumulate
# --------------------------------------------------------------------------------------------------


def _accumulate_case(n: int, k: int, dtype: torch.dtype, seed: int) -> Case:
    label = f"{str(dtype).replace('torch.', '')}, {n} samples, k={k} (chunk gives {[len(c) for c in torch.arange(n).chunk(k)]})"
    return Case(label, dict(n=n, k=k, dtype=dtype, seed=seed), size=n * 100 + k)


def accumulate_cases() -> list[Case]:
    def draw(rng: random.Random) -> Case:
        n = rng.randint(2, 30)
        return _accumulate_case(n, rng.randint(1, n), rng.choice([torch.float32, torch.float64]), rng.randint(0, 999))

    fixed = [_accumulate_case(1, 1, torch.float32, 0), _accumulate_case(7, 1, torch.float64, 1),
             _accumulate_case(7, 7, torch.float32, 2), _accumulate_case(10, 4, torch.float64, 3),
             _accumulate_case(10, 6, torch.float32, 4), _accumulate_case(30, 3, torch.float32, 5),
             _accumulate_case(30, 4, torch.float64, 6)]
    return seeded(draw, 8, seed=7, fixed=fixed)


def accumulate_setup(n: int, k: int, dtype: torch.dtype, seed: int):
    """A model (one frozen layer, one parameter the forward never uses), a criterion and a batch."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)
    model[2].requires_grad_(False)
    model.register_parameter("unused", nn.Parameter(torch.zeros(3, dtype=dtype)))
    x = torch.randn(n, 6, generator=g, dtype=torch.float64).to(dtype)
    return model, nn.CrossEntropyLoss(), x, torch.randint(0, 3, (n,), generator=g)


def accumulate_reference(case: Case) -> tuple[list, float]:
    """The big batch's gradients (None where there is none) and its mean loss."""
    model, criterion, x, y = accumulate_setup(**case.kwargs)
    loss = criterion(model(x), y)
    loss.backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()], loss.item()


def accumulate_run(fn: Callable, case: Case) -> tuple[list, Any, list[int]]:
    model, criterion, x, y = accumulate_setup(**case.kwargs)
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))
    try:
        total = run_student(lambda **kw: fn(model, criterion, x, y, kw["k"]), case)
    finally:
        handle.remove()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()], total, sizes


# --------------------------------------------------------------------------------------------------
# finder_restore
# --------------------------------------------------------------------------------------------------


def finder_case(opt: str, dtype: torch.dtype, sched: str, leftover: bool, to_none: bool, seed: int) -> Case:
    label = (f"{opt}, {str(dtype).replace('torch.', '')}, scheduler {sched}, a frozen bias, 2 param groups, "
             f"{'gradients left over' if leftover else 'no gradients'}, zero_grad(set_to_none={to_none})")
    return Case(label, dict(opt=opt, dtype=dtype, sched=sched, leftover=leftover, to_none=to_none, seed=seed),
                size=seed)


def finder_cases() -> list[Case]:
    def draw(rng: random.Random) -> Case:
        return finder_case(rng.choice(["sgd", "adam", "amsgrad", "adamw"]), rng.choice([torch.float32, torch.float64]),
                           rng.choice(["none", "StepLR", "LambdaLR"]), rng.random() < 0.5, rng.random() < 0.5,
                           rng.randint(10, 999))

    fixed = [finder_case("sgd", torch.float32, "LambdaLR", True, True, 0),
             finder_case("adamw", torch.float32, "LambdaLR", True, True, 1),
             finder_case("sgd", torch.float64, "none", False, True, 2),
             finder_case("amsgrad", torch.float64, "StepLR", True, False, 3),
             finder_case("adam", torch.float32, "StepLR", False, False, 4)]
    return seeded(draw, 3, seed=9, fixed=fixed)


def _finder_optimizer(model: nn.Module, opt: str, sched: str):
    matrices = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]  # biases (one frozen) and BatchNorm weights
    if opt == "sgd":
        groups = [{"params": matrices, "weight_decay": 1e-3}, {"params": others, "lr": 0.01}]
        optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    else:
        groups = [{"params": matrices, "weight_decay": 0.05}, {"params": others, "lr": 1e-3, "weight_decay": 0.0}]
        optimizer = (torch.optim.AdamW(groups, lr=3e-3) if opt == "adamw"
                     else torch.optim.Adam(groups, lr=3e-3, amsgrad=opt == "amsgrad"))
    scheduler = {"none": lambda: None, "StepLR": lambda: torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5),
                 "LambdaLR": lambda: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))}
    return optimizer, scheduler[sched]()


def finder_setup(opt: str, dtype: torch.dtype, sched: str, leftover: bool, to_none: bool, seed: int):
    """A model with BatchNorm (one frozen in eval mode), dropout and a frozen bias, an optimizer with two param
    groups and a scheduler (or none) that have taken 3 steps (momentum buffers / Adam moments and step counts
    exist), gradients left over or none; the random generators then seeded. Returns (model, optimizer, scheduler,
    batches, step) where step(x, y) is one training step that draws from torch's, Python's and NumPy's RNGs."""
    import numpy as np

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(7, 13), nn.BatchNorm1d(13), nn.ReLU(), nn.Dropout(0.3), nn.Linear(13, 5),
                          nn.BatchNorm1d(5)).to(dtype)
    model[0].bias.requires_grad_(False)
    optimizer, scheduler = _finder_optimizer(model, opt, sched)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [(torch.randn(9, 7, generator=g, dtype=torch.float64).to(dtype), torch.randint(0, 5, (9,), generator=g))
               for _ in range(4)]

    def step(x, y):
        optimizer.zero_grad(set_to_none=to_none)
        if random.random() < 2.0 and np.random.rand() < 2.0:  # an augmentation's draws: Python's and NumPy's RNGs
            x = x * 1.0
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss.detach()

    for x, y in batches[:3]:
        step(x, y)
    optimizer.zero_grad(set_to_none=True)
    if leftover:
        nn.functional.cross_entropy(model(batches[3][0]), batches[3][1]).backward()  # gradients left in .grad
    model[5].eval()  # a frozen BatchNorm inside a model in train mode
    torch.manual_seed(seed + 5)
    random.seed(seed + 5)
    np.random.seed(seed + 5)
    return model, optimizer, scheduler, batches, step
