"""The LR range test (Smith 2015) that restores the model and the optimizer exactly afterwards.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.optim import Optimizer
from dlo.training.optim import _check_lr, _check_range
from dlo.measure.plots import _save
from dlo.training.checkpoint import rng_state, set_rng_state


# --------------------------------------------------------------------------------------------------
# Learning-rate range test
# --------------------------------------------------------------------------------------------------

@dataclass
class LRFinderResult:
    """What :func:`lr_find` measured. ``lrs[i]`` is the lr of step i, ``losses[i]`` the loss of that step's
    batch (computed before the update), ``smoothed[i]`` its bias-corrected exponential moving average.

    - ``steepest_lr``: where the smoothed loss falls fastest per decade of lr (most negative slope of
      smoothed loss against log lr, ignoring the first 10 % and last 5 % of the points, which are noise
      and the start of the divergence, and looking only *before* the minimum of the smoothed loss: the
      descent that leads into it, not a wiggle of the flat start): a safe, rather low learning rate.
    - ``min_loss_lr``: where the smoothed loss is lowest. It is *too high* to train with: there the loss is
      already about to blow up (and it was reached with the momentum of the smaller lrs before it).
    - ``divergence_lr``: where the sweep stopped because the loss blew up, or None.
    - ``suggested_range``: ``(low, high)`` with ``high = min_loss_lr / 10`` (one decade before the
      minimum: Smith's and fastai's rule of thumb for the maximum lr, e.g. OneCycle's ``max_lr``) and
      ``low = steepest_lr`` when that is below ``high``, else ``high / 10`` (e.g. the bottom of a cyclic
      schedule). Both are clipped to the swept range.
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    steepest_lr: float
    min_loss_lr: float
    divergence_lr: float | None
    suggested_range: tuple[float, float]
    start_lr: float
    end_lr: float
    num_steps: int
    stopped_early: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (lists of floats, the suggestion as a 2-item list)."""
        d = asdict(self)
        d["suggested_range"] = list(self.suggested_range)
        return d

    def range_sentence(self, lr: float, *, what: str = "the rate used below") -> str:
        """Where ``lr`` stands against this sweep's suggested range, in one sentence written from the numbers
        (inside, below or above it, and by what factor)."""
        low, high = self.suggested_range
        where = f"{what}, {lr:.2g}, is"
        if low <= lr <= high:
            return f"{where} inside this run's suggested range ({low:.2g} … {high:.2g})."
        side, factor = ("below", low / lr) if lr < low else ("above", lr / high)
        return f"{where} {side} this run's suggested range ({low:.2g} … {high:.2g}), by a factor of {factor:.2g}."

    def plot(self, path: str | Path | None = None, *, title: str = "Learning-rate range test"):
        """Loss against lr (log scale): raw losses faint, smoothed loss bold, the steepest point, the
        minimum, the suggested range shaded and the divergence point. Returns the Figure."""
        import matplotlib.pyplot as plt


        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(self.lrs, self.losses, color="tab:blue", alpha=0.3, lw=1, label="loss")
        ax.plot(self.lrs, self.smoothed, color="tab:blue", lw=2, label="smoothed loss")
        ax.axvspan(*self.suggested_range, color="tab:green", alpha=0.15,
                   label=f"suggested {self.suggested_range[0]:.2g} .. {self.suggested_range[1]:.2g}")
        i = self.lrs.index(self.steepest_lr)
        ax.plot([self.steepest_lr], [self.smoothed[i]], "o", color="tab:green", label=f"steepest {self.steepest_lr:.2g}")
        j = self.lrs.index(self.min_loss_lr)
        ax.plot([self.min_loss_lr], [self.smoothed[j]], "v", color="tab:orange", label=f"minimum {self.min_loss_lr:.2g}")
        if self.divergence_lr is not None:
            ax.axvline(self.divergence_lr, color="tab:red", ls="--", label=f"diverged {self.divergence_lr:.2g}")
        # keep the interesting part readable: the blow-up at the end would squash the rest
        finite = [v for v in self.smoothed + self.losses if math.isfinite(v)]
        low, high = min(finite), max(finite)
        cap = self.smoothed[0] + 0.5 * abs(self.smoothed[0] - min(self.smoothed))
        top = min(high, max(cap, self.smoothed[0]))
        margin = 0.05 * (top - low) or 0.05 * abs(top) or 0.05
        ax.set_ylim(low - margin, top + margin)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        return _save(fig, path)


def _steepest_index(lrs: list[float], smoothed: list[float]) -> int:
    import numpy as np

    n = len(lrs)
    if n < 3:
        return int(np.argmin(smoothed))
    slopes = np.gradient(np.asarray(smoothed), np.log10(np.asarray(lrs)))
    start, stop = max(1, n // 10), n - max(1, n // 20)
    lowest = int(np.argmin(smoothed))
    if lowest - start >= 3:  # the descent into the minimum, not a wiggle of the flat start
        stop = min(stop, lowest + 1)
    if stop - start < 3:
        start, stop = 0, n
    return start + int(np.argmin(slopes[start:stop]))


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    return obj


def _set_lr(optimizer: Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):  # capturable / compiled optimisers keep lr as a tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _cycle(batches: Iterable) -> Iterable:
    """Yield from ``batches`` forever, starting a new pass (a new epoch of a DataLoader) when one ends."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("lr_find: 'batches' ran out (empty, or a one-shot iterator/generator shorter than "
                             "num_steps): pass a list or a DataLoader, which can be iterated again")


def save_training_state(model: nn.Module, optimizer: Optimizer, scheduler: Any = None) -> dict[str, Any]:
    """Everything a few training steps change, as *copies*: what :func:`restore_training_state` puts back.

    Parameters and buffers (BatchNorm running statistics) and the gradients, cloned (``state_dict()`` and
    ``named_parameters()`` hand out the live tensors, which the next step overwrites in place); the
    optimiser's state_dict deep-copied (its momentum buffers, Adam moments and step counts are live tensors
    too), with the param groups' lr; the scheduler's state_dict (``last_epoch``, the lrs it last set); the
    train/eval mode of every submodule; the random number generators (:func:`dlo.training.checkpoint.rng_state`:
    torch, Python, NumPy, CUDA).
    """
    return {"values": {k: t.detach().clone() for k, t in _named_tensors(model).items()},
            "grads": {k: (None if p.grad is None else p.grad.detach().clone()) for k, p in model.named_parameters()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": {name: m.training for name, m in model.named_modules(remove_duplicate=False)},
            "rng": rng_state()}


def restore_training_state(model: nn.Module, optimizer: Optimizer, scheduler: Any, saved: dict[str, Any]) -> None:
    """Put back what :func:`save_training_state` saved, *into* the same tensors (copied in place, so the
    optimiser still holds the model's parameters and every reference the caller kept stays valid)."""
    with torch.no_grad():
        for k, t in _named_tensors(model).items():
            t.copy_(saved["values"][k])
    for k, p in model.named_parameters():
        p.grad = None if saved["grads"][k] is None else saved["grads"][k].clone()
    # load_state_dict keeps the tensors it is given: a copy, so that ``saved`` can be restored again
    optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    if scheduler is not None and saved["scheduler"] is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for name, m in model.named_modules(remove_duplicate=False):
        m.training = saved["modes"][name]
    set_rng_state(saved["rng"])


def _named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def lr_find(model: nn.Module, optimizer: Optimizer, criterion: Callable, batches: Iterable, *,
            start_lr: float = 1e-7, end_lr: float = 10.0, num_steps: int = 100, smooth: float = 0.98,
            diverge_factor: float = 4.0, device: torch.device | str | None = None,
            step_fn: Callable[[Any, Any], Any] | None = None, scheduler: Any = None,
            save: Callable[..., Any] = save_training_state,
            restore: Callable[..., None] = restore_training_state) -> LRFinderResult:
    """The learning-rate range test (Smith 2017, *Cyclical Learning Rates for Training Neural Networks*):
    train one step per learning rate on successive batches while the lr grows exponentially,
    ``lr_i = start_lr * (end_lr / start_lr) ** (i / (num_steps - 1))`` (the same on every param group), and
    watch the loss: it is flat while the lr is too small to matter, falls once the lr is useful, and blows
    up when it is too large. See :class:`LRFinderResult` for how the suggestion is read off the curve.

    - ``batches``: any re-iterable of ``(x, y)`` (a DataLoader or a list); a new pass starts if it runs out.
    - The raw loss is noisy (each point is a different batch), so it is smoothed with an exponential
      moving average ``avg = smooth * avg + (1 - smooth) * loss``, divided by ``1 - smooth ** (i + 1)``
      (bias correction: the average starts at 0). The sweep stops early once the smoothed loss exceeds
      ``diverge_factor`` times the best smoothed loss so far, or the loss is not finite (assumes
      losses >= 0, as for cross-entropy or MSE). Reading each loss costs one host-device synchronisation
      per step: the price of stopping early, negligible for ~100 steps.
    - ``step_fn(x, y) -> loss``: one full optimisation step (e.g. :func:`dlo.training.step.make_train_step` for
      mixed precision); by default zero_grad / forward / backward / ``optimizer.step()`` in fp32.
      ``x`` and ``y`` are moved to ``device`` first (default: the model's device).

    The sweep trains the model, so everything it touches is put back **exactly** afterwards, even if it
    fails midway (``try / finally``): parameters, buffers (BatchNorm running statistics) and gradients,
    the optimiser (momentum buffers, Adam moments, step counts, and the param groups with their lr), the
    train/eval mode of every submodule (the sweep runs in train mode), and the random number generators
    (torch CPU and CUDA, Python, NumPy: dropout and data shuffling after the test are as if it never ran).
    Restoring is done by copying values back *into* the same tensors, so the optimiser still holds the
    model's parameters and the caller's references stay valid.

    - ``scheduler``: a learning-rate scheduler that ``step_fn`` steps (e.g. a per-batch OneCycleLR); its
      state is saved and restored too.
    - ``save(model, optimizer, scheduler) -> saved`` and ``restore(model, optimizer, scheduler, saved)``:
      how the state is saved before the sweep and put back after it (default: :func:`save_training_state`
      and :func:`restore_training_state`; the optimizers notebook passes the student's own).
    """

    _check_arguments(start_lr, end_lr, num_steps, smooth, diverge_factor)
    device = _model_device(model) if device is None else torch.device(device)
    if step_fn is None:
        step_fn = _plain_step(model, optimizer, criterion)
    saved = save(model, optimizer, scheduler)  # copies, not references (state_dict() tensors *are* the live ones)
    try:
        sweep = _sweep(model, optimizer, step_fn, batches, device, start_lr=start_lr, end_lr=end_lr,
                       num_steps=num_steps, smooth=smooth, diverge_factor=diverge_factor)
    finally:
        restore(model, optimizer, scheduler, saved)
    return _read_curve(sweep, start_lr=start_lr, end_lr=end_lr, num_steps=num_steps,
                       meta={"smooth": smooth, "diverge_factor": diverge_factor, "device": str(device)})


def _check_arguments(start_lr: float, end_lr: float, num_steps: int, smooth: float, diverge_factor: float) -> None:
    """Refuse a bad sweep in one line, before any training step."""
    _check_lr(start_lr, allow_zero=False)
    _check_lr(end_lr, allow_zero=False)
    if start_lr >= end_lr:
        raise ValueError(f"lr_find needs start_lr < end_lr, got start_lr={start_lr} and end_lr={end_lr}")
    if not isinstance(num_steps, int) or num_steps < 5:
        raise ValueError(f"num_steps must be an int >= 5 (a curve needs points), got {num_steps!r}")
    _check_range("smooth", smooth, 0.0, 1.0)
    if not (math.isfinite(diverge_factor) and diverge_factor > 1):
        raise ValueError(f"diverge_factor must be > 1, got {diverge_factor!r}")


def _model_device(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _plain_step(model: nn.Module, optimizer: Optimizer, criterion: Callable) -> Callable[[Any, Any], Any]:
    """The default training step: zero_grad / forward / backward / ``optimizer.step()`` in fp32."""
    def step_fn(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step_fn


@dataclass
class _Sweep:
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    divergence_lr: float | None = None


def _sweep(model: nn.Module, optimizer: Optimizer, step_fn: Callable[[Any, Any], Any], batches: Iterable,
           device: torch.device, *, start_lr: float, end_lr: float, num_steps: int, smooth: float,
           diverge_factor: float) -> _Sweep:
    """One training step per learning rate, the lr growing exponentially; stops once the smoothed loss
    diverges (the caller restores the training state afterwards)."""
    out = _Sweep()
    model.train()
    avg, best = 0.0, math.inf
    data = iter(_cycle(batches))
    for i in range(num_steps):
        lr = start_lr * (end_lr / start_lr) ** (i / (num_steps - 1))
        _set_lr(optimizer, lr)
        x, y = _to_device(next(data), device)
        loss = float(step_fn(x, y))
        if not math.isfinite(loss):
            out.divergence_lr = lr
            break
        avg = smooth * avg + (1 - smooth) * loss
        value = avg / (1 - smooth ** (i + 1))
        out.lrs.append(lr)
        out.losses.append(loss)
        out.smoothed.append(value)
        if i > 0 and value > diverge_factor * best:
            out.divergence_lr = lr
            break
        best = min(best, value)
    return out


def _read_curve(sweep: _Sweep, *, start_lr: float, end_lr: float, num_steps: int,
                meta: dict[str, Any]) -> LRFinderResult:
    """The suggestion read off the swept curve (see :class:`LRFinderResult`)."""
    lrs, smoothed = sweep.lrs, sweep.smoothed
    if not lrs:
        raise RuntimeError(f"lr_find: the loss was not finite at the very first lr ({start_lr:g}); "
                           "check the model and the data before the learning rate")
    steepest = lrs[_steepest_index(lrs, smoothed)]
    min_loss_lr = lrs[min(range(len(smoothed)), key=smoothed.__getitem__)]
    high = min(max(min_loss_lr / 10, lrs[0]), lrs[-1])
    low = steepest if steepest < high else max(high / 10, lrs[0])
    return LRFinderResult(lrs=lrs, losses=sweep.losses, smoothed=smoothed, steepest_lr=steepest,
                          min_loss_lr=min_loss_lr, divergence_lr=sweep.divergence_lr, suggested_range=(low, high),
                          start_lr=float(start_lr), end_lr=float(end_lr), num_steps=num_steps,
                          stopped_early=len(lrs) < num_steps, meta=meta)
