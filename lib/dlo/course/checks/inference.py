"""Checkers of ``Jour4/inference.ipynb``: the distillation loss and the sparsity of a model."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.inference import distillation_loss as reference

INFERENCE_NB = "Jour4/inference.ipynb"


def _logits(seed: int, n: int = 16, k: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(n, k, generator=g), 3 * torch.randn(n, k, generator=g), torch.randint(0, k, (n,), generator=g)


@register("inference", "distillation", ("distillation_loss",), INFERENCE_NB)
def _check_distillation(distillation_loss: Callable) -> str:
    import torch.nn.functional as F


    for seed, T, alpha in ((0, 1.0, 0.5), (1, 4.0, 0.5), (2, 2.0, 1.0), (3, 4.0, 0.0), (4, 8.0, 0.9)):
        s, t, y = _logits(seed)
        student = s.clone().requires_grad_(True)
        teacher = t.clone().requires_grad_(True)  # as if it came out of a model that tracks gradients
        got = distillation_loss(student, teacher, y, T, alpha)
        expect(isinstance(got, torch.Tensor) and got.dim() == 0,
                f"return a scalar tensor (a loss to call .backward() on), got {type(got).__name__}"
                f"{' of shape ' + str(tuple(got.shape)) if isinstance(got, torch.Tensor) else ''}")
        expect(torch.equal(teacher.detach(), t) and torch.equal(student.detach(), s),
                "the logits passed in were modified: compute on new tensors (no in-place operations on the inputs)")
        want = reference(s, t, y, T, alpha)
        if not torch.allclose(got.detach().float(), want, rtol=1e-4, atol=1e-5):
            soft = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), reduction="batchmean", log_target=True)
            hard = F.cross_entropy(s, y)
            hints = {
                "the soft term is not multiplied by T² (Hinton et al.: it keeps the gradient scale independent of T)":
                    alpha * soft + (1 - alpha) * hard,
                "the KL is averaged over the classes too (reduction='mean'): use reduction='batchmean', the mean over "
                "the batch of the sum over the classes": alpha * soft * T * T / s.shape[1] + (1 - alpha) * hard,
                "alpha weighs the wrong term: alpha multiplies the soft (teacher) term, 1 - alpha the cross-entropy":
                    (1 - alpha) * soft * T * T + alpha * hard,
                "the KL is in the wrong direction: KL(teacher ‖ student) = Σ p_teacher · (log p_teacher − log p_student)":
                    alpha * T * T * F.kl_div(F.log_softmax(t / T, -1), F.log_softmax(s / T, -1), reduction="batchmean",
                                             log_target=True) + (1 - alpha) * hard,
                "the teacher's soft targets are taken without the temperature: the temperature T divides both the "
                "teacher's and the student's logits (softmax(teacher / T))":
                    alpha * T * T * F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t, -1), reduction="batchmean",
                                             log_target=True) + (1 - alpha) * hard,
                "the student's log-probabilities are taken without the temperature: the temperature T divides both "
                "the teacher's and the student's logits (log_softmax(student / T))":
                    alpha * T * T * F.kl_div(F.log_softmax(s, -1), F.log_softmax(t / T, -1), reduction="batchmean",
                                             log_target=True) + (1 - alpha) * hard,
            }
            hint = next((h for h, v in hints.items() if torch.allclose(got.detach().float(), v, rtol=1e-4, atol=1e-5)),
                        "compare your formula with alpha · T² · KL(softmax(t/T) ‖ softmax(s/T)) + (1 − alpha) · CE(s, y)")
            raise CheckFailed(f"T={T}, alpha={alpha}: expected {want.item():.5f}, got {got.item():.5f} -- {hint}")
        expect(got.requires_grad, "the loss does not depend on the student's logits through autograd "
                                   "(no .detach() / .item() / torch.no_grad() on the student side)")
        got.backward()
        expect(teacher.grad is None or teacher.grad.abs().max() == 0,
                "a gradient flows into the teacher's logits: detach them (the teacher is not trained)")
        s_ref = s.clone().requires_grad_(True)
        reference(s_ref, t, y, T, alpha).backward()
        expect(student.grad is not None and torch.allclose(student.grad, s_ref.grad, rtol=1e-4, atol=1e-6),
                f"T={T}, alpha={alpha}: the loss has the right value but not the right gradient for the student")
    return "alpha · T² · KL(teacher ‖ student) + (1 − alpha) · CE, teacher detached and untouched"


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
