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


# --------------------------------------------------------------------------------------------------
# channels_last
# --------------------------------------------------------------------------------------------------

CL = torch.channels_last


def reference_channels_last(model: nn.Module, images: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    return model.to(memory_format=CL), images.contiguous(memory_format=CL)


def _cl_case(s: dict) -> Case:
    n, c, h, w = s["shape"]
    model = {"identity": "nn.Identity()", "linear": "a linear model"}.get(s["model"], f"a conv model of width "
                                                                                      f"{s['width']}")
    label = (f"{model}{' with BatchNorm' if s['norm'] and s['model'] != 'identity' else ''} in {'train' if s['train'] else 'eval'} mode, "
             f"{str(s['dtype']).replace('torch.', '')} images of shape {tuple(s['shape'])}"
             + (" already channels_last" if s["given_cl"] else ""))
    return Case(label, {"spec": s}, size=n * c * h * w + (0 if s["model"] == "identity" else 100))


def _cl_draw(rng: random.Random) -> Case:
    kind = rng.choice(["identity", "conv", "conv", "linear"])
    side = 5 if kind == "linear" else rng.choice([1, 3, 4, 7])
    shape = (rng.choice([1, 2, 3, 5]), 3 if kind != "identity" else rng.choice([1, 2, 3, 4]), side,
             side if kind == "linear" else rng.choice([side, 2, 5]))
    return _cl_case({"model": kind, "width": rng.choice([2, 5, 8]), "norm": rng.random() < 0.5,
                     "seed": rng.randint(0, 10 ** 6), "shape": shape, "dtype": rng.choice(
                         [torch.float32, torch.float32, torch.bfloat16, torch.float16]),
                     "train": rng.random() < 0.7, "given_cl": rng.random() < 0.15})


def _cl_fixed(**over: Any) -> Case:
    s = {"model": "conv", "width": 4, "norm": True, "seed": 0, "shape": (8, 3, 8, 8), "dtype": torch.float32,
         "train": True, "given_cl": False}
    s.update(over)
    return _cl_case(s)


CL_CASES = seeded(_cl_draw, 10, seed=5, fixed=[
    _cl_fixed(), _cl_fixed(model="identity", shape=(1, 1, 4, 4)), _cl_fixed(model="identity", shape=(2, 3, 1, 1)),
    _cl_fixed(shape=(1, 3, 5, 3), train=False, norm=False), _cl_fixed(model="linear", shape=(3, 3, 5, 5))])


def _cl_inputs(s: dict) -> tuple[nn.Module, torch.Tensor]:
    n, c, h, w = s["shape"]
    if s["model"] == "identity":
        model: nn.Module = nn.Identity()
    else:
        model = make_model(s["model"], s["width"], s["norm"], False, s["seed"], side=h)
    model.train(s["train"])
    g = torch.Generator().manual_seed(s["seed"])
    images = torch.randn(n, c, h, w, generator=g).to(s["dtype"])
    return model, (images.contiguous(memory_format=CL) if s["given_cl"] else images)


def _cl_images(case: Case, x: torch.Tensor, kept: torch.Tensor, x2: Any) -> None:
    """The images returned: the given shape, dtype and values, laid out channels_last (else what they are)."""
    expect(isinstance(x2, torch.Tensor) and x2.shape == x.shape,
           f"with {case.label}: the images must keep their shape {tuple(x.shape)} (N, C, H, W), got "
           f"{tuple(x2.shape) if isinstance(x2, torch.Tensor) else type(x2).__name__}: channels_last changes the "
           "layout in memory, not the order of the axes (no permute)")
    expect(x2.dtype == x.dtype, f"with {case.label}: the images are {x2.dtype}, they were given as {x.dtype}: only "
                                "the layout may change")
    if not x2.is_contiguous(memory_format=CL):
        try:
            explain_not_channels_last(x, x2)
        except Exception as exc:  # CheckFailed, said with the case
            raise type(exc)(f"with {case.label}: {exc}") from None
    expect(torch.equal(x2, kept), f"with {case.label}: the values must not change, only the layout (got "
                                  f"{x2.flatten()[:4].tolist()} ..., expected {kept.flatten()[:4].tolist()} ...)")


def _cl_model(case: Case, model: nn.Module, m: Any, before: dict, mode: bool) -> None:
    expect(isinstance(m, nn.Module), f"with {case.label}: return the pair (model, images); the first item is a "
                                     f"{type(m).__name__}")
    expect(m is model, f"with {case.label}: the model returned is another module than the one given: convert the "
                       "given model and return it (the optimizer is built on its parameters)")
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        expect(t.dim() != 4 or t.is_contiguous(memory_format=CL),
               f"with {case.label}: the model's {name} is still NCHW in memory (strides {t.stride()}): the returned "
               f"model was not converted to channels_last")
    expect(model.training == mode, f"with {case.label}: the model was given in {'train' if mode else 'eval'} mode "
                                   f"and returned in {'train' if model.training else 'eval'} mode: only the layout "
                                   "may change")
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    expect(not changed, f"with {case.label}: the model's {changed[0] if changed else ''} changed value: only the "
                        "layout may change")


def check_channels_last(to_channels_last: Callable) -> str:
    for case in CL_CASES:
        s = case.kwargs["spec"]
        model, x = _cl_inputs(s)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        kept = x.clone(memory_format=torch.preserve_format)
        out = run_student(lambda spec: to_channels_last(model, x), case)
        expect(isinstance(out, tuple) and len(out) == 2, "return the pair (model, images)")
        _cl_model(case, model, out[0], before, s["train"])
        _cl_images(case, x, kept, out[1])
    return (f"model weights and images are NHWC (channels_last) in memory, values, shapes and mode unchanged, on "
            f"{len(CL_CASES)} generated cases (batches of 1 to 8, 1 to 4 channels, images of 1x1 to 8x8)")
