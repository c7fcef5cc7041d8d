"""Checkers of ``Jour4/inference.ipynb``: the distillation loss and the sparsity of a model."""
from __future__ import annotations

import random
from typing import Callable

import torch
from torch import nn

from dlo.course.checks.cases import Case, compare, first_failure, run_student, seeded
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.inference import distillation_loss as reference

INFERENCE_NB = "Jour4/inference.ipynb"


def _distillation_case(rng: random.Random) -> Case:
    n, k = rng.choice([1, 3, 5, 16]), rng.choice([2, 3, 7, 10])
    return _dcase(n, k, rng.choice([0.5, 1.0, 2.5, 4.0, 8.0]), rng.choice([0.0, 0.3, 0.5, 0.9, 1.0]),
                  rng.choice([torch.float32, torch.float64]), rng.randint(0, 10 ** 6))


def _dcase(n: int, k: int, T: float, alpha: float, dtype: torch.dtype, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    s, t = (3 * torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    label = f"{str(dtype).replace('torch.', '')}, batch {n}, {k} classes, T={T}, alpha={alpha}"
    return Case(label, dict(student_logits=s, teacher_logits=t, labels=torch.randint(0, k, (n,), generator=g), T=T,
                            alpha=alpha), size=n * k)


DISTILLATION_CASES = seeded(_distillation_case, 10, seed=11, fixed=[
    _dcase(3, 7, 4.0, 0.5, torch.float32, 0), _dcase(16, 10, 1.0, 0.5, torch.float32, 1),
    _dcase(5, 3, 2.5, 1.0, torch.float64, 2), _dcase(16, 10, 4.0, 0.0, torch.float32, 3),
    _dcase(1, 2, 8.0, 0.9, torch.float64, 4)])


def _distillation_mistakes(s, t, y, T, alpha) -> dict[str, torch.Tensor]:
    import torch.nn.functional as F

    def kl(a, b):
        return F.kl_div(F.log_softmax(a, -1), F.log_softmax(b, -1), reduction="batchmean", log_target=True)

    soft, hard = kl(s / T, t / T), F.cross_entropy(s, y)
    return {
        "the soft term is not multiplied by T² (Hinton et al.: it keeps the gradient scale independent of T)":
            alpha * soft + (1 - alpha) * hard,
        "the KL is averaged over the classes too (reduction='mean'): use reduction='batchmean', the mean over the "
        "batch of the sum over the classes": alpha * soft * T * T / s.shape[1] + (1 - alpha) * hard,
        "alpha weighs the wrong term: alpha multiplies the soft (teacher) term, 1 - alpha the cross-entropy":
            (1 - alpha) * soft * T * T + alpha * hard,
        "the KL is in the wrong direction: KL(teacher ‖ student) = Σ p_teacher · (log p_teacher − log p_student)":
            alpha * T * T * kl(t / T, s / T) + (1 - alpha) * hard,
        "the teacher's soft targets are taken without the temperature: the temperature T divides both the "
        "teacher's and the student's logits (softmax(teacher / T))": alpha * T * T * kl(s / T, t) + (1 - alpha) * hard,
        "the student's log-probabilities are taken without the temperature: the temperature T divides both the "
        "teacher's and the student's logits (log_softmax(student / T))": alpha * T * T * kl(s, t / T) + (1 - alpha) * hard,
    }


@register("inference", "distillation", ("distillation_loss",), INFERENCE_NB)
def _check_distillation(distillation_loss: Callable) -> str:
    student = lambda student_logits, teacher_logits, labels, T, alpha: distillation_loss(  # noqa: E731 - positional
        student_logits, teacher_logits, labels, T, alpha)
    for case in DISTILLATION_CASES:
        kw = case.kwargs
        inputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        got = run_student(lambda **a: student(**a), Case(case.label, inputs))
        expect(isinstance(got, torch.Tensor) and got.dim() == 0,
               f"with {case.label}: return a scalar tensor (a loss to call .backward() on), got {type(got).__name__}"
               f"{' of shape ' + str(tuple(got.shape)) if isinstance(got, torch.Tensor) else ''}")
        expect(all(torch.equal(inputs[k], kw[k]) for k in ("student_logits", "teacher_logits")),
               "the logits passed in were modified: compute on new tensors (no in-place operations on the inputs)")
    failure = first_failure(DISTILLATION_CASES, student, reference, what="the loss", grads=True, scale=10)
    if failure:
        case, problem = failure
        if "teacher_logits is there" in problem:
            problem = "a gradient flows into the teacher's logits: detach them (the teacher is not trained)"
        elif problem.startswith("the loss"):
            problem += _named_distillation_mistake(student)
        raise CheckFailed(f"with {case.label}: {problem}")
    return (f"alpha · T² · KL(teacher ‖ student) + (1 − alpha) · CE, values and gradients on {len(DISTILLATION_CASES)} "
            "cases (batches of 1 to 16, 2 to 10 classes, T from 0.5 to 8, float32 and float64); teacher detached")


def _named_distillation_mistake(student: Callable) -> str:
    """The known mistake whose formula the answer follows on every case, if any."""
    with torch.no_grad():
        got = [student(**c.kwargs) for c in DISTILLATION_CASES]
        wrong = [_distillation_mistakes(*c.kwargs.values()) for c in DISTILLATION_CASES]
    for why in wrong[0]:
        if all(compare(g, w[why], "", scale=10) is None for g, w in zip(got, wrong)):
            return f" -- {why}"
    return " (alpha · T² · KL(softmax(t/T) ‖ softmax(s/T)) + (1 − alpha) · CE(s, y), the KL a mean over the batch)"


def _sparsity_model(seed: int = 0) -> tuple[nn.Module, float]:
    """A model with known zeros, and its expected sparsity over the Conv2d and Linear weights."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(32, 10),
                          nn.Sequential(nn.Linear(10, 10, bias=False)))
    conv, bn, lin, inner = model[0], model[1], model[4], model[5][0]
    zeros = total = 0
    with torch.no_grad():
        for layer, frac in ((conv, 0.25), (lin, 0.8), (inner, 0.0)):
            w = torch.randn(layer.weight.shape, generator=g)
            w[w == 0] = 1.0
            n = layer.weight.numel()
            k = int(frac * n)
            w.view(-1)[torch.randperm(n, generator=g)[:k]] = 0.0
            layer.weight.copy_(w)
            zeros, total = zeros + k, total + n
        conv.bias.zero_()  # zeros that are not weights: biases and norm layers do not count
        bn.weight.zero_()
        lin.bias.zero_()
    return model, zeros / total


def _number(got: object) -> float:
    expect(isinstance(got, (float, int)) and not isinstance(got, bool)
            or (isinstance(got, torch.Tensor) and got.numel() == 1),
            f"return a number (a Python float), got {type(got).__name__}")
    return float(got)


@register("inference", "sparsity", ("model_sparsity",), INFERENCE_NB)
def _check_sparsity(model_sparsity: Callable) -> str:
    from torch.nn.utils import prune

    model, want = _sparsity_model()
    got = _number(model_sparsity(model))
    if abs(got - want) > 1e-6:
        layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        top = [m for m in model.children() if isinstance(m, (nn.Conv2d, nn.Linear))]
        params = list(model.parameters())
        frac = lambda ts: sum(int((t == 0).sum()) for t in ts) / sum(t.numel() for t in ts)  # noqa: E731
        candidates = {
            "that is the mean of the per-layer fractions: count zeros and weights over all layers together":
                sum(float((m.weight == 0).float().mean()) for m in layers) / len(layers),
            "a nested layer was missed: go through model.modules() (every layer, at any depth), not model.children()":
                frac([m.weight for m in top]),
            "only the weights of Conv2d and Linear layers count (not biases, not BatchNorm parameters)": frac(params),
            "that is a percentage: return the fraction of zero weights, a number in [0, 1]": 100 * want,
        }
        hint = next((h for h, v in candidates.items() if abs(got - v) < 1e-6),
                    "count the zeros of every Conv2d and Linear weight (at any depth), divided by the number of those weights")
        raise CheckFailed(f"expected {want:.4f} on a model with known zeros, got {got:.4f} -- {hint}")
    pruned = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 10))
    prune.l1_unstructured(pruned[0], "weight", amount=0.6)  # mask attached, prune.remove not called
    want = (int(0.6 * 600 + 0.5) + int((pruned[2].weight == 0).sum())) / 900
    got = _number(model_sparsity(pruned))
    expect(abs(got - want) < 1e-6,
            f"expected {want:.4f} on a model pruned with prune.l1_unstructured (mask not removed yet), got {got:.4f} -- "
            "before prune.remove the parameter is weight_orig (no zeros): read module.weight, the masked weight")
    return "zeros over all Conv2d / Linear weights together, pruning masks included"
