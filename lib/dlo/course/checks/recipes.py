"""Checkers of Jour3/recipes.ipynb (course ``recipes``): the progressive-resizing schedule, the EMA update and
test-time augmentation, each against a reference on generated cases (:mod:`.recipes_cases`).

- resize: the library's :func:`dlo.training.callbacks.resolution_at` on schedules of one to five pairs (sizes that go
  up, down and repeat, unevenly spaced starts), every epoch from 0 to three past the last start.
- ema: the exact float64 EMA on models in float32, float64, bfloat16 and float16, decays 0 to 1, one to five updates,
  weights given as parameters that require grad, BatchNorm buffers included; the tolerance follows from the dtypes.
  The average is a running statistic, not part of training: it must leave autograd's graph (no gradient flows into
  it), which is checked instead of gradients.
- tta: :func:`dlo.training.evaluate.tta_probabilities` on odd and square images, one row, a batch of 1, float32,
  float64 and bfloat16 models. TTA is inference: no gradients to compare.
A known mistake is named only when its formula gives the answer's output on every case tried (:func:`.cases.judge`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from dlo.course.checks.cases import Case, compare, judge
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.recipes_cases import EmaRun, ema_runs, ema_tolerance, resize_cases, tta_cases
from dlo.training.callbacks import resolution_at as reference
from dlo.training.evaluate import tta_probabilities

RECIPES_NB = "Jour3/recipes.ipynb"
RESIZE_CASES = resize_cases()
TTA_CASES = tta_cases()


def _resize_same(got: Any, want: int, case: Case) -> str | None:
    if got == want and not isinstance(got, bool):
        return None
    return (f"the size is {got!r}, expected {want} (the size of the last (start, size) pair with start <= epoch, "
            "pairs applying from their start epoch on)")


_RESIZE_MISTAKES = (
    (lambda schedule, epoch: max(size for start, size in schedule if start <= epoch),
     "that is the largest size started so far: the schedule may go down, take the LAST started pair"),
    (lambda schedule, epoch: reference(schedule, epoch + 1),
     "that is the next epoch's size: epochs count from 0 (a pair applies from its start epoch on)"),
)


@register("recipes", "resize", ("resolution_at",), RECIPES_NB)
def _check_resize(resolution_at: Callable) -> str:
    tried = judge(RESIZE_CASES, lambda schedule, epoch: resolution_at(list(schedule), epoch), reference,
                  _RESIZE_MISTAKES, same=_resize_same)
    return f"the size of the last (start, size) pair with start <= epoch, on {tried} schedules and epochs"


# ------------------------------------------------------------------------------------------------ EMA


def _ema_step(ema_update: Callable, run: EmaRun, names: list[str], average: list, current: list, step: int) -> list[torch.Tensor]:
    before = [t.detach().clone() for t in current]
    where = f"with {run.label}, update {step}"
    try:  # on the model's own tensors (not copies): writing into them must show
        out = ema_update(average, current, run.decay)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported, in one line
        raise CheckFailed(f"{where}: it raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    expect(isinstance(out, (list, tuple)) and len(out) == len(average)
           and all(isinstance(t, torch.Tensor) for t in out),
           f"{where}: return a list of {len(average)} tensors (one per weight / buffer), got {type(out).__name__}")
    expect(all(torch.equal(a, b.detach()) for a, b in zip(before, current)), f"{where}: do not modify the model's "
           "weights")
    graph = [names[i] for i, t in enumerate(out) if t.requires_grad]
    expect(not graph, f"{where}: the average of {graph[0] if graph else ''} requires grad: it is part of the "
           "autograd graph of the model's parameters, and each update keeps the graph of all the previous ones alive; "
           "the average must be computed from the weights' values only (detached, or under torch.no_grad())")
    for t, a in zip(out, average):
        model_dtype = str(run.dtype).replace("torch.", "")
        expect(t.dtype == a.dtype and t.shape == a.shape,
               f"{where}: your average comes back as {t.dtype} {tuple(t.shape)}, expected {a.dtype} {tuple(a.shape)}"
               + (f": keep it in its own dtype (rounded to {model_dtype}, updates of (1 - decay) * (weights - average) "
                  "fall below its resolution and the average stops moving)" if t.dtype == run.dtype != a.dtype else ""))
    return [t.detach().clone() for t in out]


def _ema_trajectory(ema_update: Callable, run: EmaRun) -> tuple[list[str], list[list[torch.Tensor]], list, list]:
    """The student's averages after each update, the exact ones (float64), the tolerances and the weights given."""
    names, model, average = run.start()
    exact = [t.double() for t in average]
    tol = [torch.zeros_like(t) for t in exact]
    mine, currents = [], []
    for step in range(1, run.steps + 1):
        run.move(model, step)
        current = run.current(model)
        currents.append([t.detach().clone() for t in current])
        tol = [s + ema_tolerance(e, c, run.decay, run.average_dtype) for s, e, c in zip(tol, exact, current)]
        exact = [run.decay * e + (1 - run.decay) * c.detach().double() for e, c in zip(exact, current)]
        average = _ema_step(ema_update, run, names, average, current, step)
        mine.append(average)
    return names, mine, [exact, tol], currents


def _ema_difference(names: list[str], mine: list[torch.Tensor], exact: list, tol: list) -> tuple[int, str] | None:
    for i, (m, e, t) in enumerate(zip(mine, exact, tol)):
        diff = (m.double() - e).abs()
        if bool((diff > t).any()):
            at = int((diff - t).flatten().argmax())
            return i, (f"{names[i]} differs from the exact EMA by {diff.flatten()[at].item():.3g} at element {at}, "
                       f"more than the rounding of the dtypes allows there ({t.flatten()[at].item():.3g})")
    return None


def _ema_named(run: EmaRun, names: list[str], mine: list, currents: list, wrong: list[int]) -> str:
    """A known mistake when the answer's averages equal its formula at every update of this run, else ''."""
    copied = all(torch.equal(got[i].double(), now[i].double()) for got, now in zip(mine, currents) for i in wrong)
    if 0 < len(wrong) < len(names) and copied:
        return (f": {', '.join(names[i] for i in wrong)} not averaged like the others (copied from the model at "
                "every update): every floating-point tensor, BatchNorm buffers included, gets the same EMA")
    _, _, start = run.start()
    swapped = [t.double() for t in start]
    same_swapped = same_current = True
    for got, current in zip(mine, currents):
        swapped = [run.decay * c.double() + (1 - run.decay) * s for s, c in zip(swapped, current)]
        same_swapped &= all(torch.allclose(g.double(), s, atol=1e-5) for g, s in zip(got, swapped))
        same_current &= all(torch.allclose(g.double(), c.double(), atol=1e-5) for g, c in zip(got, current))
    if same_swapped:
        return ": decay multiplies the new weights instead of the average"
    if same_current:
        return ": your average equals the current weights: nothing of the old average is kept"
    return ""


@register("recipes", "ema", ("ema_update",), RECIPES_NB)
def _check_ema(ema_update: Callable) -> str:
    runs = ema_runs()
    for run in runs:
        names, mine, (exact, tol), currents = _ema_trajectory(ema_update, run)
        problem = _ema_difference(names, mine[-1], exact, tol)
        if problem is None:
            continue
        wrong = [i for i in range(len(names)) if _ema_difference([names[i]], [mine[-1][i]], [exact[i]], [tol[i]])]
        raise CheckFailed(f"with {run.label}: {problem[1]}" + _ema_named(run, names, mine, currents, wrong))
    return (f"the exact EMA within the dtypes' rounding on {len(runs)} runs (float32, float64, bfloat16 and float16 "
            "models, decays 0 to 1, BatchNorm buffers included), the model untouched, the average out of autograd")


# ------------------------------------------------------------------------------------------------ TTA


def _tta_ref(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return tta_probabilities(model, images, True)


def _views(flip: Callable, combine: Callable) -> Callable:
    def variant(model, images):
        with torch.no_grad():
            return combine(model(images).float(), model(flip(images)).float())
    return variant


def _mean_probs(a: torch.Tensor, b: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return (torch.softmax(a, dim) + torch.softmax(b, dim)) / 2


_TTA_MISTAKES = (
    (_views(lambda x: x, lambda a, b: torch.softmax(a, 1)),
     "you return the prediction on the image alone: add its horizontal flip (x.flip(-1))"),
    (_views(lambda x: x.flip(-2), _mean_probs), "that is an up-down flip (dim -2): flip left-right, along the width "
                                                "(dim -1)"),
    (_views(lambda x: x.flip(-1), lambda a, b: torch.softmax((a + b) / 2, 1)),
     "you averaged the logits: average the softmax probabilities of the two views"),
    (_views(lambda x: x.flip(1), _mean_probs),
     "that flips along dim 1, the colour channels (RGB -> BGR): flip left-right, along the width (dim -1)"),
    (_views(lambda x: x.flip(0), _mean_probs),
     "that flips along dim 0, the order of the images in the batch: flip each image left-right, along the width "
     "(dim -1)"),
    (_views(lambda x: x.flip(-1), lambda a, b: _mean_probs(a, b, 0)),
     "the softmax is taken over dim 0, across the images of the batch: take it over the classes (dim=1), so that "
     "each row sums to 1"),
    (_views(lambda x: x.flip(-1), lambda a, b: 2 * _mean_probs(a, b)),
     "you add the two views' probabilities: take their mean (divide by the number of views), so that each row sums "
     "to 1"),
)


def _tta_same(got: Any, want: torch.Tensor, case: Case) -> str | None:
    if not isinstance(got, torch.Tensor) or not got.is_floating_point():
        return f"the result is {type(got).__name__} {getattr(got, 'dtype', '')}, expected a tensor of probabilities"
    model_dtype = case.kwargs["images"].dtype  # the probabilities may come in the model's dtype or in float32
    low = model_dtype in (torch.bfloat16, torch.float16)
    return compare(got.detach().to(want.dtype), want, "the averaged probabilities",
                   dtype=model_dtype if low else torch.float32)


@register("recipes", "tta", ("tta_predict",), RECIPES_NB)
def _check_tta(tta_predict: Callable) -> str:
    def student(model, images):
        with torch.no_grad():
            return tta_predict(model, images.clone())

    tried = judge(TTA_CASES, student, _tta_ref, _TTA_MISTAKES, same=_tta_same)
    return (f"the mean of the softmax over the image and its left-right mirror, on {tried} batches (odd and square "
            "images, a batch of 1, float32, float64 and bfloat16 models)")
