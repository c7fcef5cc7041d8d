"""Checkers of Jour3/recipes.ipynb (course ``recipes``): the progressive-resizing schedule, the EMA update
(against ``torch.optim.swa_utils.AveragedModel``) and test-time augmentation (against
:func:`dlo.training.evaluate.tta_probabilities`)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.training.callbacks import resolution_at as reference
from dlo.training.evaluate import tta_probabilities

RECIPES_NB = "Jour3/recipes.ipynb"


@register("recipes", "resize", ("resolution_at",), RECIPES_NB)
def _check_resize(resolution_at: Callable) -> str:

    # the last one goes down at the end (a schedule may finish at a smaller size): "the largest started" is wrong
    cases = [([(0, 16), (2, 24), (4, 32)], range(8)), ([(0, 32)], range(3)), ([(0, 8), (1, 12), (5, 16)], range(7)),
             ([(0, 20), (3, 28)], range(5)), ([(0, 24), (2, 32), (5, 28)], range(8))]
    for schedule, epochs in cases:
        for epoch in epochs:
            got, want = resolution_at(list(schedule), epoch), reference(schedule, epoch)
            largest = max(size for start, size in schedule if start <= epoch)
            why = (" -- that is the largest size started so far: the schedule may go down, take the LAST started pair"
                   if got == largest != want else "")
            if not why and got == reference(schedule, epoch + 1) != want:
                why = " -- that is the next epoch's size: epochs count from 0 (a pair applies from its start epoch on)"
            expect(got == want, f"schedule {schedule}, epoch {epoch}: expected {want} (the size of the last "
                                 f"(start, size) with start <= epoch), got {got!r}{why}")
    return "the size of the last (start, size) pair with start <= epoch, for every epoch"


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


def _ema_tolerance(avg: torch.Tensor, current: torch.Tensor, decay: float) -> torch.Tensor:
    """What one EMA step may differ by, element by element, from the exact float64 update: (1 - decay) · weights
    computed in the model's dtype (the natural ``decay * ema + (1 - decay) * w`` rounds that product to it), and the
    sum rounded to the average's float32 (a few ulps)."""
    model_eps, avg_eps = torch.finfo(current.dtype).eps, torch.finfo(torch.float32).eps
    return model_eps * (1 - decay) * current.double().abs() + 4 * avg_eps * avg.double().abs()


def _check_ema_low_precision(ema_update: Callable) -> None:
    """A 16-bit model (bfloat16, float16), a float32 average, decay 0.999: (1 - decay) · (weights - average) is far
    below 16-bit resolution near 1, so an average rounded to the model's dtype never moves. The tolerance follows from
    the dtypes (:func:`_ema_tolerance`, summed over the steps): about 5e-5 here, below one step's move (2e-4), far
    below what an average rounded to bfloat16 is off by (up to 4e-3)."""
    for dtype, seed in ((torch.bfloat16, 3), (torch.float16, 4)):
        g = torch.Generator().manual_seed(seed)
        start = 1 + 0.01 * torch.randn(16, generator=g)
        mine, want, tol = [start.clone()], start.double(), torch.zeros(16, dtype=torch.float64)
        for _ in range(5):
            current = (start + 0.2 + 0.05 * torch.randn(16, generator=g)).to(dtype)
            tol += _ema_tolerance(want, current, 0.999)
            want = 0.999 * want + 0.001 * current.double()
            out = ema_update(mine, [current], 0.999)
            expect(isinstance(out, (list, tuple)) and len(out) == 1 and isinstance(out[0], torch.Tensor),
                   "return a list with one tensor per weight / buffer")
            expect(out[0].dtype == torch.float32,
                   f"with a {dtype} model your average comes back in {out[0].dtype}: keep it in its own dtype "
                   f"(float32): rounded to {dtype}, updates of (1 - decay) * (weights - average) fall below its "
                   "resolution and the average stops moving")
            mine = [out[0].detach().clone()]
        diff = (mine[0].double() - want).abs()
        worst = int((diff - tol).argmax())
        expect(bool((diff <= tol).all()),
               f"with a {dtype} model and a float32 average (decay 0.999, 5 updates), the average differs from the "
               f"exact EMA by {diff[worst].item():.3g} at element {worst}, more than the rounding of {dtype} and "
               f"float32 allows there ({tol[worst].item():.3g}; an average rounded to {dtype} at some step is off by "
               f"up to {torch.finfo(dtype).eps / 2:.3g} near 1, and one step moves it by about 2e-4)")


@register("recipes", "ema", ("ema_update",), RECIPES_NB)
def _check_ema(ema_update: Callable) -> str:
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    g = torch.Generator().manual_seed(0)
    for decay in (0.9, 0.5):
        torch.manual_seed(0)
        model = _Small()
        ref = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        ref.update_parameters(model)  # the first update copies the weights
        names = [k for k, t in model.state_dict().items() if t.dtype.is_floating_point]
        mine = [t.detach().clone().float() for t in model.state_dict().values() if t.dtype.is_floating_point]
        swapped = [t.clone() for t in mine]  # the known mistake: decay on the new weights
        for _ in range(3):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g))
                model.bn.running_mean.add_(torch.randn(3, generator=g))
                model.bn.running_var.mul_(torch.rand(3, generator=g) + 0.5)
            ref.update_parameters(model)
            current = [t.detach() for t in model.state_dict().values() if t.dtype.is_floating_point]
            before = [t.clone() for t in current]
            out = ema_update(mine, current, decay)
            expect(isinstance(out, (list, tuple)) and len(out) == len(mine),
                    f"return a list of {len(mine)} tensors (one per weight / buffer), got {type(out).__name__}")
            expect(all(torch.equal(a, b) for a, b in zip(before, current)), "do not modify the model's weights")
            mine = [t.detach().clone() for t in out]
            swapped = [decay * c.float() + (1 - decay) * e for e, c in zip(swapped, current)]
        want = [t.float() for t in ref.module.state_dict().values() if t.dtype.is_floating_point]
        wrong = [i for i, (a, b) in enumerate(zip(mine, want)) if a.shape != b.shape or not torch.allclose(a, b, atol=1e-5)]
        if wrong and len(wrong) < len(want):
            copied = [names[i] for i in wrong if mine[i].shape == current[i].shape
                      and torch.allclose(mine[i], current[i].float(), atol=1e-6)]
            raise CheckFailed(f"decay={decay}: {', '.join(names[i] for i in wrong)} not averaged like the others"
                              + (" (copied from the model)" if copied else "")
                              + ": every floating-point tensor, BatchNorm buffers included, gets the same EMA")
        if wrong:
            i = wrong[0]
            diff = (mine[i] - want[i]).abs().max().item() if mine[i].shape == want[i].shape else float("nan")
            same = [why for other, why in (
                (swapped, "decay multiplies the new weights instead of the average"),
                (current, "your average equals the current weights: nothing of the old average is kept"))
                if all(a.shape == b.shape and torch.allclose(a, b.float(), atol=1e-5) for a, b in zip(mine, other))]
            raise CheckFailed(f"decay={decay}, after 3 updates: your EMA of {names[i]} differs from AveragedModel's "
                              f"by up to {diff:.3g}" + (f": {same[0]}" if same else ""))
    _check_ema_low_precision(ema_update)
    return ("same averages as torch.optim.swa_utils.AveragedModel (weights and BatchNorm buffers), 3 updates; a "
            "float32 average of a bfloat16 model keeps moving")


class _Asym(nn.Module):
    """Not mirror-symmetric: its output changes when the image is flipped left-right."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = nn.Parameter(torch.randn(5, 3 * 4 * 6, generator=g))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x.flatten(1) @ self.w.T


@register("recipes", "tta", ("tta_predict",), RECIPES_NB)
def _check_tta(tta_predict: Callable) -> str:

    model = _Asym()
    x = torch.randn(7, 3, 4, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = tta_predict(model, x.clone())
        want = tta_probabilities(model, x, True)
        only_image = torch.softmax(model(x), 1)
        vflip = (torch.softmax(model(x), 1) + torch.softmax(model(x.flip(-2)), 1)) / 2
        logits_mean = torch.softmax((model(x) + model(x.flip(-1))) / 2, 1)
        other_flips = {dim: (torch.softmax(model(x), 1) + torch.softmax(model(x.flip(dim)), 1)) / 2 for dim in (0, 1)}
        over_batch = (torch.softmax(model(x), 0) + torch.softmax(model(x.flip(-1)), 0)) / 2
    expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
            f"return the averaged probabilities, a tensor of shape {tuple(want.shape)}, got "
            f"{getattr(got, 'shape', type(got).__name__)}")
    got = got.float()
    if torch.allclose(got, want, atol=1e-5):
        return "the mean of the softmax over the image and its left-right mirror"
    if torch.allclose(got, only_image, atol=1e-5):
        raise CheckFailed("you return the prediction on the image alone: add its horizontal flip (x.flip(-1))")
    if torch.allclose(got, vflip, atol=1e-5):
        raise CheckFailed("that is an up-down flip (dim -2): flip left-right, along the width (dim -1)")
    if torch.allclose(got, logits_mean, atol=1e-5):
        raise CheckFailed("you averaged the logits: average the softmax probabilities of the two views")
    if torch.allclose(got, other_flips[1], atol=1e-5):
        raise CheckFailed("that flips along dim 1, the colour channels (RGB -> BGR): flip left-right, along the width "
                          "(dim -1)")
    if torch.allclose(got, other_flips[0], atol=1e-5):
        raise CheckFailed("that flips along dim 0, the order of the images in the batch: flip each image left-right, "
                          "along the width (dim -1)")
    if torch.allclose(got, over_batch, atol=1e-5):
        raise CheckFailed("the softmax is taken over dim 0, across the images of the batch: take it over the classes "
                          "(dim=1), so that each row sums to 1")
    if torch.allclose(got, 2 * want, atol=1e-5):
        raise CheckFailed("you add the two views' probabilities: take their mean (divide by the number of views), "
                          "so that each row sums to 1")
    raise CheckFailed("expected (softmax(model(x)) + softmax(model(x.flip(-1)))) / 2")
