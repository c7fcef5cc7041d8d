"""Optimisers, learning-rate schedules and the learning-rate range test, for the lessons on large batches.

What is here, and why it is written the way it is:

- :class:`Lion`, :class:`LARS`, :class:`LAMB`: three optimisers that ``torch.optim`` does not ship, written
  by hand in a few readable lines each (the maintained SGD / Adam / AdamW are used everywhere else).
  LARS and LAMB scale each tensor's update by a *trust ratio* ``||p|| / ||update||``: with very large
  batches the base learning rate is so high that a plain step would be larger than the weights
  themselves in some layers; the ratio keeps every layer's *relative* change comparable.
- :func:`param_groups`: the usual split "weights get weight decay, biases and normalisation parameters
  do not" (decaying a BatchNorm scale towards 0 only fights the normalisation), with an ``"adapt"`` key
  that LARS / LAMB read to skip the trust ratio for those small 1-D tensors.
- :func:`make_optimizer` / :func:`make_scheduler`: one name -> one configured object, with one-line errors
  for the usual mistakes, so a lesson can sweep names in a loop.
- :func:`scaled_lr`: the linear scaling rule for the batch size.
- :func:`lr_find`: the learning-rate range test (Smith 2017), which puts the model, the optimiser and the
  random number generators back exactly as it found them.

Every optimiser here updates parameters with tensor operations only: norms and trust ratios stay on the
device (``torch.where`` instead of ``if norm > 0``), so a step never waits for the GPU to answer a
question in Python (no host-device synchronisation).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim import lr_scheduler as sched
from dlo.measure.plots import _save

OPTIMIZERS = ("sgd", "sgd_nesterov", "adam_l2", "adamw", "lamb", "lars", "lion")
SCHEDULES = ("constant", "step", "cyclic", "onecycle", "warmup_cosine")


# --------------------------------------------------------------------------------------------------
# Shared checks (one line each: the message is what a student reads first)
# --------------------------------------------------------------------------------------------------

def _check_lr(lr: float, *, allow_zero: bool) -> None:
    value = float(lr)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"learning rate must be a finite number {bound}, got {lr!r}")


def _check_betas(betas: Any) -> tuple[float, float]:
    try:
        b1, b2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair (beta1, beta2) with 0 <= beta < 1, got {betas!r}") from None
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must be a pair (beta1, beta2) with 0 <= beta < 1, got {tuple(betas)!r}")
    return b1, b2


def _check_range(name: str, value: float, low: float, high: float | None = None) -> None:
    value = float(value)
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        where = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {where}, got {value!r}")


def _grads(group: dict) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, gradient) for the parameters of ``group`` that received a gradient."""
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError("sparse gradients are not supported by this optimizer")
        yield p, p.grad


def _trust_ratio(numerator: torch.Tensor, denominator: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """``numerator / (denominator + eps)`` where both norms are > 0, else 1 -- as a 0-d tensor, so the
    decision is made on the device without a host synchronisation. A zero weight norm happens for freshly
    zero-initialised tensors; a zero update norm when a layer got no gradient: in both cases the ratio
    would be 0 or undefined and the layer would never move, so the plain update is used."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / (denominator + eps), torch.ones_like(numerator))


def lars_trust_ratio(w_norm: torch.Tensor, g_norm: torch.Tensor, weight_decay: float, trust_coefficient: float,
                     eps: float = 0.0) -> torch.Tensor:
    """LARS's trust ratio ``eta ||w|| / (||g|| + wd ||w||)`` (You et al. 2017, eq. 6; 1 where a norm is 0): the
    sum of two norms, not the norm ``||g + wd w||`` of the decayed gradient (an upper bound of it)."""
    return _trust_ratio(trust_coefficient * w_norm, g_norm + weight_decay * w_norm, eps)


# --------------------------------------------------------------------------------------------------
# Optimisers written by hand
# --------------------------------------------------------------------------------------------------

class Lion(Optimizer):
    """Lion, "EvoLved Sign Momentum" (Chen et al. 2023, *Symbolic Discovery of Optimization Algorithms*).

    For each parameter ``p`` with gradient ``g`` and momentum ``m`` (state ``'exp_avg'``, starts at 0)::

        c = beta1 * m + (1 - beta1) * g        # interpolation used for the *direction* only
        p = p * (1 - lr * wd) - lr * sign(c)   # decoupled weight decay, then a step of size lr per coordinate
        m = beta2 * m + (1 - beta2) * g        # slower average kept for the next step

    Why it behaves differently from Adam: every coordinate moves by exactly ``lr`` (the sign throws the
    magnitude away), so the update norm is large: use a learning rate 3-10x *smaller* than AdamW's and a
    weight decay 3-10x *larger* (the product lr * wd is what shrinks the weights). It keeps one state
    tensor instead of Adam's two: less memory.
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        _check_lr(lr, allow_zero=True)
        betas = _check_betas(betas)
        _check_range("weight_decay", weight_decay, 0.0)
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p, g in _grads(group):
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                if wd != 0:
                    p.mul_(1 - lr * wd)
                c = m.mul(beta1).add_(g, alpha=1 - beta1)
                p.add_(c.sign_(), alpha=-lr)
                m.mul_(beta2).add_(g, alpha=1 - beta2)
        return loss


class LARS(Optimizer):
    """LARS, Layer-wise Adaptive Rate Scaling (You, Gitman & Ginsburg 2017, *Large Batch Training of
    Convolutional Networks*): momentum SGD whose step is rescaled per tensor by a trust ratio.

    The exact formula used here, the paper's (there are several variants in the wild: some put the trust
    ratio on the learning rate after the momentum, some clip it, some apply it to biases too). For each
    parameter ``p`` with gradient ``g``, in a group with ``"adapt": True`` (the default)::

        d     = g + wd * p                                       # L2 weight decay, coupled
        trust = eta * ||p|| / (||g|| + wd * ||p|| + eps)   if ||p|| > 0 and the denominator > 0, else 1
        buf   = momentum * buf + trust * d                       # buf starts at 0 (state 'momentum_buffer')
        p     = p - lr * buf                                     # nesterov: p - lr * (trust * d + momentum * buf)

    The denominator is ``||g|| + wd * ||p||`` (You et al. 2017, eq. 6; as in timm and pytorch-optimizer),
    an upper bound of ``||d|| = ||g + wd * p||``: the two differ when the gradient and the weights point
    in different directions, and the paper's ratio is then the smaller one.

    ``eta`` is ``trust_coefficient`` (0.001 in the paper, so ``lr`` is typically of order 1-10). In a
    group with ``"adapt": False`` (biases and normalisation parameters, see :func:`param_groups`) the
    trust ratio **and** the weight decay are skipped: ``buf = momentum * buf + g``, plain momentum SGD. Those
    1-D tensors are tiny, often start at 0 or 1, and a ratio based on their norm is meaningless. Note that
    with ``lr`` of order 1, "plain" there means a large step: give such groups their own smaller ``lr`` if
    they misbehave.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, eps: float = 1e-8, nesterov: bool = False):
        _check_lr(lr, allow_zero=True)
        _check_range("momentum", momentum, 0.0, 1.0)
        _check_range("weight_decay", weight_decay, 0.0)
        _check_range("eps", eps, 0.0)
        if not (math.isfinite(float(trust_coefficient)) and float(trust_coefficient) > 0):
            raise ValueError(f"trust_coefficient must be > 0, got {trust_coefficient!r}")
        if nesterov and momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov, adapt=True))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            eta, eps, adapt = group["trust_coefficient"], group["eps"], group.get("adapt", True)
            for p, g in _grads(group):
                if adapt:
                    w_norm = torch.linalg.vector_norm(p)
                    d = g.add(p, alpha=wd) if wd != 0 else g
                    trust = lars_trust_ratio(w_norm, torch.linalg.vector_norm(g), wd, eta, eps)
                    d = d * trust
                else:
                    d = g
                if mu == 0:
                    p.add_(d, alpha=-lr)
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.mul_(mu).add_(d)
                update = d.add(buf, alpha=mu) if group["nesterov"] else buf
                p.add_(update, alpha=-lr)
        return loss


class LAMB(Optimizer):
    """LAMB, Layer-wise Adaptive Moments for Batch training (You et al. 2020, *Large Batch Optimization for
    Deep Learning: Training BERT in 76 minutes*): Adam's direction with a per-tensor trust ratio.

    For each parameter ``p`` with gradient ``g`` at step ``t`` (1, 2, ...)::

        m = beta1 * m + (1 - beta1) * g                # state 'exp_avg'
        v = beta2 * v + (1 - beta2) * g**2             # state 'exp_avg_sq'
        r = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + wd * p
        trust = ||p|| / ||r||    (1 if either norm is 0)
        p = p - lr * trust * r

    The weight decay is decoupled (added to Adam's direction, as in AdamW) and included in ``r``, so it is
    scaled by the same trust ratio. Groups with ``"adapt": False`` use ``trust = 1`` and no weight decay
    (this is then exactly Adam with bias correction). No clipping of the ratio (the paper's phi is the
    identity here).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        _check_lr(lr, allow_zero=True)
        betas = _check_betas(betas)
        _check_range("eps", eps, 0.0)
        _check_range("weight_decay", weight_decay, 0.0)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=True))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, wd, adapt = group["lr"], group["eps"], group["weight_decay"], group.get("adapt", True)
            beta1, beta2 = group["betas"]
            for p, g in _grads(group):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                r = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt_().add_(eps))
                if adapt:
                    if wd != 0:
                        r.add_(p, alpha=wd)
                    r.mul_(_trust_ratio(torch.linalg.vector_norm(p), torch.linalg.vector_norm(r)))
                p.add_(r, alpha=-lr)
        return loss


# --------------------------------------------------------------------------------------------------
# Parameter groups and the optimiser factory
# --------------------------------------------------------------------------------------------------

def param_groups(model: nn.Module, weight_decay: float, *, exclude_bias_and_norm: bool = True) -> list[dict]:
    """Split the trainable parameters of ``model`` into (at most) two optimiser groups:

    - ``"decay"``: tensors with ``ndim > 1`` (conv kernels, linear and embedding matrices):
      ``weight_decay`` and ``adapt=True``;
    - ``"no_decay"``: the rest, i.e. biases and BatchNorm / LayerNorm / GroupNorm scales and shifts:
      ``weight_decay=0`` and ``adapt=False``.

    Why: weight decay pulls weights towards 0 to limit the effective capacity; a bias or a normalisation
    scale carries no such capacity, and decaying a BatchNorm scale only fights the normalisation
    (Goyal et al. 2017, "no bias decay"). ``adapt=False`` tells :class:`LARS` / :class:`LAMB` to skip the
    trust ratio for them; ``torch.optim`` optimisers keep the unknown key in the group and ignore it.

    The rule is by shape, not by module type, so it also covers custom layers; the flip side is that 2-D
    tensors that are not "weights" (e.g. a ViT's position embedding) do get decay -- build the groups by
    hand for those. Frozen parameters (``requires_grad=False``) are left out; an empty group is dropped.
    With ``exclude_bias_and_norm=False``: one group, every tensor decayed and adapted.
    """
    _check_range("weight_decay", weight_decay, 0.0)
    params = [p for p in model.parameters() if p.requires_grad]
    if not exclude_bias_and_norm:
        return [{"name": "all", "params": params, "weight_decay": weight_decay, "adapt": True}]
    groups = [
        {"name": "decay", "params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay, "adapt": True},
        {"name": "no_decay", "params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0, "adapt": False},
    ]
    return [g for g in groups if g["params"]]


def make_optimizer(name: str, params_or_model, *, lr: float, weight_decay: float = 0.0, momentum: float = 0.9,
                   betas: tuple[float, float] | None = None, **kw: Any) -> Optimizer:
    """Build an optimiser by name (one of :data:`OPTIMIZERS`).

    - ``"sgd"``: ``torch.optim.SGD`` with ``momentum``; ``"sgd_nesterov"``: the same with Nesterov momentum.
    - ``"adam_l2"``: ``torch.optim.Adam(weight_decay=...)``: the decay is an L2 penalty *added to the
      gradient* (coupled), so it goes through Adam's per-coordinate normalisation: coordinates with large
      gradients are barely decayed. ``"adamw"``: ``torch.optim.AdamW``, decoupled: ``p -= lr * wd * p``
      applied directly (Loshchilov & Hutter 2019). Both are identical when ``weight_decay == 0``.
    - ``"lamb"``, ``"lars"``, ``"lion"``: the classes of this module.

    ``params_or_model``: an ``nn.Module`` (split with :func:`param_groups`, so biases and normalisation
    parameters get no weight decay), or what any optimiser accepts (an iterable of tensors or of group
    dicts). ``momentum`` is used by sgd / sgd_nesterov / lars, ``betas`` by adam_l2 / adamw / lamb / lion
    (None: each optimiser's default); each is validated always but ignored by the optimisers that have no
    use for it, so one call signature sweeps every name. ``kw`` goes to the constructor (``eps``,
    ``trust_coefficient``, ``foreach``, ...).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")
    _check_lr(lr, allow_zero=False)
    if betas is not None:
        betas = _check_betas(betas)
    _check_range("momentum", momentum, 0.0, 1.0)
    _check_range("weight_decay", weight_decay, 0.0)
    if name == "sgd_nesterov" and momentum == 0:
        raise ValueError("sgd_nesterov needs momentum > 0 (Nesterov's look-ahead is a momentum trick)")
    if isinstance(params_or_model, nn.Module):
        params = param_groups(params_or_model, weight_decay)
    else:
        params = list(params_or_model)
    beta_kw = {} if betas is None else {"betas": betas}
    if name in ("sgd", "sgd_nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=name == "sgd_nesterov", **kw)
    if name == "adam_l2":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **beta_kw, **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **beta_kw, **kw)
    if name == "lamb":
        return LAMB(params, lr=lr, weight_decay=weight_decay, **beta_kw, **kw)
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **kw)
    return Lion(params, lr=lr, weight_decay=weight_decay, **beta_kw, **kw)


def scaled_lr(base_lr: float, batch_size: int, base_batch: int = 256) -> float:
    """The linear scaling rule (Goyal et al. 2017, *Accurate, Large Minibatch SGD: Training ImageNet in
    1 Hour*): when the batch is k times larger, multiply the learning rate by k,
    ``base_lr * batch_size / base_batch``.

    Why it works: with k times fewer steps per epoch, k small SGD steps are roughly one step along the sum
    of their gradients, i.e. one step of k times the size on the large batch -- as long as the gradient
    does not change much over those k steps.

    When it breaks down: early in training (the weights, hence the gradients, change fast): use a few
    epochs of linear warm-up (``make_scheduler("warmup_cosine", ...)``); and for very large batches (beyond
    ~8k images for ResNet-50 on ImageNet) the scaled rate is so large that some layers' updates exceed
    their weights and training diverges even with warm-up: that is what LARS / LAMB's per-layer trust
    ratio is for. For Adam-type optimisers a square-root rule (``* sqrt(k)``) is often the better start.
    """
    _check_lr(base_lr, allow_zero=False)
    if batch_size <= 0 or base_batch <= 0:
        raise ValueError(f"batch_size and base_batch must be > 0, got {batch_size} and {base_batch}")
    return base_lr * batch_size / base_batch


# --------------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------------

def warmup_steps(total_steps: int, fraction: float = 0.2, minimum: int = 2) -> int:
    """Warm-up steps for a run of ``total_steps``: ``fraction`` of them, at least ``minimum`` (a 1-step warm-up
    is none: its step already uses ``lr * 1 / 1``), refused when no step would be left after it."""
    if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
    if not isinstance(minimum, int) or minimum < 2:
        raise ValueError(f"minimum must be an int >= 2 (a 1-step warm-up starts at the full rate), got {minimum!r}")
    _check_range("fraction", fraction, 0.0, 1.0)
    if total_steps <= minimum:
        raise ValueError(f"a run of {total_steps} steps cannot warm up over {minimum} steps and still train after: "
                         "give it more steps (epochs, data) or a smaller batch")
    return min(total_steps - 1, max(minimum, int(fraction * total_steps)))


def _base_lrs(optimizer: Optimizer) -> list[float]:
    return [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]


def _with_warmup(optimizer: Optimizer, warmup_steps: int, main: sched.LRScheduler | None) -> sched.LRScheduler:
    """Linear warm-up: the lr of step i (0-based) is ``lr * (i + 1) / warmup_steps`` for i < warmup_steps,
    reaching the full lr at the last warm-up step, then ``main`` takes over (or the lr stays constant when
    ``main`` is None). ``LinearLR`` refuses a start factor of 0, and a first step at lr 0 would be wasted
    anyway: hence ``(i + 1)``."""
    warm = sched.LinearLR(optimizer, start_factor=1.0 / warmup_steps, end_factor=1.0,
                          total_iters=warmup_steps - 1)
    if main is None:
        return warm
    return sched.SequentialLR(optimizer, [warm, main], milestones=[warmup_steps])


def _momentum_in_use(optimizer: Optimizer) -> bool:
    return "momentum" in optimizer.defaults and float(optimizer.defaults["momentum"]) > 0


def make_scheduler(name: str, optimizer: Optimizer, total_steps: int, *, warmup_steps: int = 0,
                   **kw: Any) -> sched.LRScheduler:
    """Build a learning-rate schedule by name (one of :data:`SCHEDULES`), all from
    ``torch.optim.lr_scheduler`` and all meant to be stepped **once per optimiser step** (not per epoch),
    ``total_steps`` times in all. The optimiser's current lr is the reference ("base") lr.

    - ``"constant"``: the base lr (after the warm-up, if any).
    - ``"step"``: ``StepLR``: multiply by ``gamma`` (0.1) every ``step_size`` steps (a third of the
      post-warm-up steps): the classic ResNet recipe (with warm-up: Goyal et al.'s large-batch recipe).
    - ``"cyclic"``: ``CyclicLR``, triangular between base lr / 10 and base lr, ``step_size_up`` (a quarter
      of the run: two full cycles) steps up then as many down. When the optimiser uses momentum (SGD with
      momentum > 0, LARS) the momentum is cycled the opposite way, between momentum - 0.1 and momentum;
      Adam-type optimisers keep their betas. No warm-up (the cycle ramps up by itself).
    - ``"onecycle"``: ``OneCycleLR`` with ``max_lr`` = the optimiser's lr: from max_lr/25 up to max_lr
      (over ``warmup_steps`` if given, else 30 % of the run), then cosine down to max_lr/1e4. When the
      optimiser uses momentum (SGD with momentum > 0, LARS) the momentum is cycled between 0.95 and 0.85.
      Optimisers with ``betas`` (Adam, AdamW, LAMB, Lion) keep them: ``OneCycleLR`` would otherwise
      overwrite beta1 at every step, which for Lion is not even a momentum (it only mixes the gradient
      into the sign); pass ``cycle_momentum=True`` to cycle beta1 anyway.
    - ``"warmup_cosine"``: ``SequentialLR`` of a ``LinearLR`` warm-up over ``warmup_steps`` steps, then
      ``CosineAnnealingLR`` from the base lr down to 0, reached just after the last step (the last step
      uses a tiny but non-zero lr). With ``warmup_steps=0``: the cosine alone.

    Warm-up (``constant``, ``step``, ``warmup_cosine``): step i < warmup_steps uses
    ``lr * (i + 1) / warmup_steps``. ``kw`` goes to the underlying torch scheduler (``gamma``, ``step_size``,
    ``step_size_up``, ``pct_start``, ...).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}")
    if not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"total_steps must be a positive int (optimizer steps in the run), got {total_steps!r}")
    if not isinstance(warmup_steps, int) or not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps must be an int in [0, total_steps={total_steps}), got {warmup_steps!r}")
    main_steps = total_steps - warmup_steps
    base = _base_lrs(optimizer)
    if name == "constant":
        if kw:
            raise ValueError(f"'constant' takes no options, got {sorted(kw)}")
        if warmup_steps:
            return _with_warmup(optimizer, warmup_steps, None)
        return sched.ConstantLR(optimizer, factor=1.0, total_iters=0)
    if name == "step":
        kw.setdefault("step_size", max(1, main_steps // 3))
        kw.setdefault("gamma", 0.1)
        if warmup_steps:
            return _with_warmup(optimizer, warmup_steps, sched.StepLR(optimizer, **kw))
        return sched.StepLR(optimizer, **kw)
    if name == "warmup_cosine":
        kw.setdefault("eta_min", 0.0)
        if warmup_steps:
            return _with_warmup(optimizer, warmup_steps, sched.CosineAnnealingLR(optimizer, T_max=main_steps, **kw))
        return sched.CosineAnnealingLR(optimizer, T_max=total_steps, **kw)
    if name == "cyclic":
        if warmup_steps:
            raise ValueError("'cyclic' has no warm-up: its cycle ramps up by itself (tune step_size_up)")
        kw.setdefault("step_size_up", max(1, total_steps // 4))
        kw.setdefault("cycle_momentum", _momentum_in_use(optimizer))
        if kw["cycle_momentum"]:
            moms = [float(g.get("momentum", 0.0)) for g in optimizer.param_groups]
            kw.setdefault("max_momentum", moms)
            kw.setdefault("base_momentum", [max(0.0, m - 0.1) for m in moms])
        return sched.CyclicLR(optimizer, base_lr=[lr / 10 for lr in base], max_lr=base, **kw)
    # onecycle
    if warmup_steps:
        kw.setdefault("pct_start", warmup_steps / total_steps)
    kw.setdefault("cycle_momentum", _momentum_in_use(optimizer))
    return sched.OneCycleLR(optimizer, max_lr=base, total_steps=total_steps, **kw)


def schedule_values(name: str, total_steps: int, lr: float = 0.1, **kw: Any) -> list[float]:
    """The lr used at each of the ``total_steps`` optimiser steps of schedule ``name`` (for plots and tests),
    computed on a dummy parameter with momentum SGD at ``lr``. ``kw`` as for :func:`make_scheduler`."""
    _check_lr(lr, allow_zero=False)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr, momentum=0.9)
    scheduler = make_scheduler(name, opt, total_steps, **kw)
    values = []
    for _ in range(total_steps):
        values.append(float(opt.param_groups[0]["lr"]))
        opt.step()  # no gradient: a no-op, but it keeps the "scheduler.step() before optimizer.step()" check quiet
        scheduler.step()
    return values


def plot_schedules(names: Sequence[str], total_steps: int, *, lr: float = 0.1, warmup_steps: int = 0,
                   path: str | Path | None = None, title: str = "Learning-rate schedules"):
    """One line per schedule: lr against the optimiser step. ``warmup_steps`` is given to every schedule
    that has a warm-up (all but ``cyclic``). Returns the Figure (saved as PNG when ``path`` is given)."""
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        warm = 0 if name == "cyclic" else warmup_steps
        ax.plot(range(total_steps), schedule_values(name, total_steps, lr=lr, warmup_steps=warm), label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
