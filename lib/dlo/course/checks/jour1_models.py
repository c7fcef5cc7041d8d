"""Checkers of Jour 1's steps that take a model and hand it back or read it: evaluate (``evaluate_fast``) and
channels_last (``to_channels_last``), registered by dlo.course.checks.jour1.

Both run the answer and the reference on generated cases (dlo.course.checks.cases.seeded): small seeded
convolutional and linear models of several widths, with and without BatchNorm (running statistics drawn away from
0 and 1, so eval mode changes the predictions) and Dropout, given in train or eval mode; batches of 1, odd and even
sizes, lists of batches of equal and of different sizes; images of odd sides, one channel or three. What is
compared: evaluate's accuracy, the state every forward ran in (no autograd graph, eval mode), the weights and
BatchNorm statistics left unchanged; to_channels_last's images (values, shape, layout in memory), the model
returned (the one given, every 4-d weight channels_last, its mode and its outputs unchanged).
"""
from __future__ import annotations

import copy
import random
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.cases import Case, run_student, seeded
from dlo.course.checks.framework import expect
from dlo.course.checks.jour1_cases import batch, make_model, record_state
from dlo.course.checks.jour1_probes import explain_not_channels_last


# --------------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------------

def reference_evaluate(model: nn.Module, batches: list) -> float:
    model.eval()
    correct, total = 0, 0
    with torch.inference_mode():
        for images, labels in batches:
            correct += int((model(images).argmax(dim=1) == labels).sum())
            total += labels.numel()
    return correct / total


def _eval_case(s: dict) -> Case:
    extras = [w for w, on in (("BatchNorm", s["norm"]), ("Dropout", s["dropout"])) if on]
    label = (f"a {s['kind']} model of width {s['width']}" + (f" with {' and '.join(extras)}" if extras else "")
             + f" given in {'train' if s['train'] else 'eval'} mode, {s['classes']} classes, batches of "
             + "+".join(str(n) for n in s["sizes"]))
    return Case(label, {"spec": s}, size=sum(s["sizes"]) * s["width"])


def _eval_draw(rng: random.Random) -> Case:
    n = rng.choice([1, 2, 3, 4])
    first = rng.choice([2, 4, 5, 8])
    sizes = [first] * (n - 1) + [rng.choice([1, 3, first])]
    return _eval_case({"kind": rng.choice(["conv", "linear"]), "width": rng.choice([3, 8, 16]),
                       "norm": rng.random() < 0.6, "dropout": rng.random() < 0.5, "seed": rng.randint(0, 10 ** 6),
                       "classes": rng.choice([2, 3, 10]), "sizes": sizes, "train": rng.random() < 0.8})


def _eval_fixed(**over: Any) -> Case:
    s = {"kind": "conv", "width": 4, "norm": True, "dropout": False, "seed": 0, "classes": 10, "sizes": [8, 5, 3],
         "train": True}
    s.update(over)
    return _eval_case(s)


EVAL_CASES = seeded(_eval_draw, 10, seed=4, fixed=[
    _eval_fixed(sizes=[1]), _eval_fixed(kind="linear", norm=False, dropout=True, sizes=[4, 4, 1], classes=3),
    _eval_fixed(), _eval_fixed(sizes=[6, 6], train=False)])


def _eval_inputs(s: dict) -> tuple[nn.Module, list]:
    model = make_model(s["kind"], s["width"], s["norm"], s["dropout"], s["seed"], s["classes"])
    model.train(s["train"])
    return model, [batch(n, 5, s["classes"], s["seed"] + k) for k, n in enumerate(s["sizes"])]


def _known_formulas(s: dict) -> dict[str, float]:
    """What the known wrong formulas give on a case: the mean of the batches' accuracies, and the correct count
    divided by the number of batches times the first batch's size."""
    model, batches = _eval_inputs(s)
    model.eval()
    with torch.inference_mode():
        right = [int((model(x).argmax(1) == y).sum()) for x, y in batches]
    return {"mean": sum(r / len(y) for r, (_, y) in zip(right, batches)) / len(batches),
            "first": sum(right) / (len(batches) * len(batches[0][1]))}


def _layers_in_training(model: nn.Module) -> list[tuple[str, str]]:
    """Hooks on the layers whose behaviour depends on the mode (BatchNorm, Dropout): the names of those that ran a
    forward in training mode are added to the list returned."""
    seen: list[tuple[str, str]] = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.Dropout)):
            m.register_forward_pre_hook(lambda mod, args, name=name: seen.append((type(mod).__name__, name))
                                        if mod.training else None)
    return seen


def _eval_one(evaluate_fast: Callable, case: Case) -> tuple[Any, float]:
    """The answer's accuracy on ``case`` and the reference's; what its forwards ran in is checked on the way."""
    s = case.kwargs["spec"]
    want = reference_evaluate(*_eval_inputs(s))
    model, batches = _eval_inputs(s)
    seen, training = record_state(model), _layers_in_training(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kept = copy.deepcopy(batches)
    got = run_student(lambda spec: evaluate_fast(model, batches), case)
    expect(bool(seen), f"with {case.label}: the model was never called: run it on every batch")
    expect(all(r["inference"] or not r["grad"] for r in seen),
           f"with {case.label}: the forward passes built an autograd graph: evaluation needs no gradients "
           "(inference_mode or no_grad)")
    effect = {"BatchNorm": "normalised with each batch's statistics instead of its running ones",
              "Dropout": "dropped activations at random"}
    if training:
        kind, name = training[0]
        what = next(v for k, v in effect.items() if kind.startswith(k))
        expect(False, f"with {case.label}: the model was still in training mode: its layer {name} ({kind}) {what}; "
                      "model.eval() switches every layer to its evaluation behaviour")
    expect(len(seen) == len(batches), f"with {case.label}: the model was called {len(seen)} time"
                                      f"{'s' * (len(seen) != 1)} for {len(batches)} batches: call it once on each "
                                      "batch")
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    expect(not changed, f"with {case.label}: evaluating changed the model's {changed[0] if changed else ''}: "
                        "evaluation must leave weights and statistics as they were")
    expect(all(torch.equal(a, b) for (a, _), (b, _) in zip(batches, kept)),
           f"with {case.label}: the images were changed in place")
    return got, want


def check_evaluate(evaluate_fast: Callable) -> str:
    runs = [(case, *_eval_one(evaluate_fast, case)) for case in EVAL_CASES]
    wrong = [(case, got, want) for case, got, want in runs
             if not (isinstance(got, float) and abs(got - want) < 1e-6)]
    if wrong:
        case, got, want = wrong[0]
        expect(isinstance(got, (int, float, torch.Tensor)) and not isinstance(got, bool),
               f"with {case.label}: return the accuracy as a float, got {type(got).__name__}")
        value = float(got)
        formulas = [(case, value, _known_formulas(case.kwargs["spec"])) for case, value, _ in
                    [(c, float(g), w) for c, g, w in runs]]
        close = lambda key: all(abs(v - f[key]) < 1e-6 for _, v, f in formulas)  # noqa: E731
        expect(not close("mean"),
               f"with {case.label}: you averaged the batches' accuracies ({value:.4g}): with batches of different "
               f"sizes count the correct predictions and divide by the number of images ({want:.4g})")
        expect(not close("first"),
               f"with {case.label}: you divided by the number of batches times the first batch's size "
               f"({value:.4g}): the last batch can be smaller; divide the correct predictions by the number of "
               f"images ({want:.4g})")
        expect(abs(value - want) >= 1e-6,
               f"with {case.label}: return the accuracy as a float ({want:.4g} here), got {got!r}")
        expect(False, f"with {case.label}: the accuracy is {value:.4g}, expected {want:.4g}")
    return (f"eval mode, no autograd graph, weights and statistics untouched, the accuracy of the reference on "
            f"{len(runs)} generated cases (batches of 1 to 8, of equal and different sizes)")
