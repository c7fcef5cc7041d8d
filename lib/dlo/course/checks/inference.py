"""Checkers of ``Jour4/inference.ipynb``: the distillation loss and the sparsity of a model."""
from __future__ import annotations

import random
from typing import Callable

import torch
from torch import nn
from torch.nn.utils import prune

from dlo.course.checks.cases import Case, compare, first_failure, run_student, seeded
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.inference import distillation_loss as reference
from dlo.lessons.inference import prune_global
from dlo.lessons.inference import sparsity as reference_sparsity

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


# --------------------------------------------------------------------------------------------------
# sparsity: generated nested models against dlo.lessons.inference.sparsity
# --------------------------------------------------------------------------------------------------

def _zero(w: torch.Tensor, frac: float, g: torch.Generator) -> None:
    """Non-zero random values in ``w``, then ``frac`` of them (rounded) set to 0."""
    with torch.no_grad():
        v = torch.randn(w.shape, generator=g)
        v[v == 0] = 1.0
        k = round(frac * v.numel())
        v.view(-1)[torch.randperm(v.numel(), generator=g)[:k]] = 0.0
        w.copy_(v)


class _Tower(nn.Module):
    """A container (no forward: only its weights matter) of nested layers that are not all Conv2d / Linear."""


def _sparsity_model(level: float, masks: str, seed: int) -> nn.Module:
    """A nested model: an Embedding and a LayerNorm (zeros that do not count), Linear layers 1 and 2 deep (odd
    sizes, with and without bias), a Conv2d + BatchNorm2d block, one Linear registered twice (a tied layer) and a
    top-level head. Each Conv2d / Linear weight gets about ``level`` of zeros (the layers differ, so the mean of
    the per-layer fractions is not the answer). ``masks``: "none", "one" (prune.l1_unstructured on one layer whose
    weight_orig already has zeros of its own) or "global" (dlo's prune_global, masks kept)."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    d, h, v = rng.choice([3, 5, 7]), rng.choice([6, 9, 11]), rng.choice([4, 13])
    model = _Tower()
    model.embed = nn.Embedding(v, d)
    model.norm = nn.LayerNorm(d)
    model.blocks = nn.ModuleList([nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d, bias=bool(i)))
                                  for i in range(rng.choice([1, 2]))])
    model.conv = nn.Sequential(nn.Conv2d(rng.choice([1, 3]), 2, rng.choice([1, 3])), nn.BatchNorm2d(2))
    model.tied = nn.Sequential(nn.Sequential(model.blocks[0][0]))  # the same Linear, used a second time
    model.head = nn.Linear(d, rng.choice([2, 5]), bias=False)
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for i, layer in enumerate(layers):  # unequal shares: level, a bit above or below (0 and 1 stay exact)
        share = level if level in (0.0, 1.0) else min(1.0, max(0.0, level + (0.1 if i % 2 else -0.1) * rng.random()))
        _zero(layer.weight, 1.0 if level > 0.95 and i else share, g)
    for p in (model.embed.weight, model.norm.weight, model.norm.bias, model.conv[1].weight):
        _zero(p, 0.5, g)  # zeros outside the Conv2d / Linear weights: they must not count
    for layer in layers:
        if layer.bias is not None:
            _zero(layer.bias, 0.5, g)
    if masks == "one":
        prune.l1_unstructured(model.blocks[-1][2], "weight", amount=0.6)
    elif masks == "global":
        prune_global(model, amount=min(level, 0.9), make_permanent=False)
    return model


def _sparsity_case(level: float, masks: str, seed: int) -> Case:
    return Case(f"nested model {seed} (Embedding, LayerNorm, a tied Linear, Conv2d), about {level:g} of the Conv2d / "
                f"Linear weights zero, pruning masks: {masks}",
                dict(level=level, masks=masks, seed=seed), size=seed)


SPARSITY_CASES = seeded(
    lambda rng: _sparsity_case(rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]), rng.choice(["none", "one", "global"]),
                               rng.randint(10, 999)), 6, seed=5,
    fixed=[_sparsity_case(0.5, "none", 0), _sparsity_case(0.0, "none", 1), _sparsity_case(0.99, "none", 2),
           _sparsity_case(1.0, "none", 3), _sparsity_case(0.3, "one", 4), _sparsity_case(0.6, "global", 5)])


def _frac(tensors) -> float:
    tensors = list(tensors)
    return sum(int((t == 0).sum()) for t in tensors) / sum(t.numel() for t in tensors)


def _layers(model: nn.Module, modules=None) -> list[nn.Module]:
    return [m for m in (modules if modules is not None else model.modules()) if isinstance(m, (nn.Conv2d, nn.Linear))]


#: Known mistakes: the message, and the formula that gives the answer's number on every case when it is that one.
_SPARSITY_MISTAKES: list[tuple[str, Callable[[nn.Module], float]]] = [
    ("that is the mean of the per-layer fractions: count zeros and weights over all layers together",
     lambda m: sum(float((x.weight == 0).float().mean()) for x in _layers(m)) / len(_layers(m))),
    ("a nested layer was missed: go through model.modules() (every layer, at any depth), not model.children()",
     lambda m: _frac(x.weight for x in _layers(m, m.children()))),
    ("only the weights of Conv2d and Linear layers count (not biases, not BatchNorm parameters)",
     lambda m: _frac(m.parameters())),
    ("every parameter called weight with 2 or more dims is counted: that takes an Embedding's weight in (only "
     "Conv2d and Linear layers count) and, on a pruned layer, weight_orig, which has no mask applied (read "
     "module.weight, the masked weight)", lambda m: _frac(p for n, p in m.named_parameters() if "weight" in n and p.dim() > 1)),
    ("the weight of every module with a 2-d or larger weight is counted: that takes an Embedding in; only Conv2d and "
     "Linear layers count", lambda m: _frac(x.weight for x in m.modules() if isinstance(getattr(x, "weight", None),
                                                                                        torch.Tensor) and x.weight.dim() > 1)),
    ("a layer used twice (a tied layer) is counted twice: each layer counts once, as model.modules() gives it",
     lambda m: _frac(x.weight for x in _layers(m, m.modules(remove_duplicate=False)))),
    ("on a pruned layer only the zeros of weight_mask are counted: module.weight is weight_orig * weight_mask, "
     "whose zeros also include weight_orig's own", lambda m: _frac(
         x.weight_mask if hasattr(x, "weight_mask") else x.weight for x in _layers(m))),
    ("that is a percentage: return the fraction of zero weights, a number in [0, 1]",
     lambda m: 100 * _frac(x.weight for x in _layers(m))),
    ("that is the fraction of non-zero weights (the density): the sparsity is the fraction of zeros",
     lambda m: 1 - _frac(x.weight for x in _layers(m))),
]


def _model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**{k: p.detach().clone() for k, p in model.named_parameters()},
            **{k: b.clone() for k, b in model.named_buffers()}}


def _state_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> str | None:
    """What changed in the model's parameters and buffers, in a few words, or None."""
    gone, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    if gone or new:
        return ", ".join([f"{k} is gone" for k in gone[:2]] + [f"{k} appeared" for k in new[:2]])
    changed = [k for k in before if before[k].shape != after[k].shape or not torch.equal(before[k], after[k])]
    return f"{changed[0]} was modified" if changed else None


@register("inference", "sparsity", ("model_sparsity",), INFERENCE_NB)
def _check_sparsity(model_sparsity: Callable) -> str:
    got = []
    for case in SPARSITY_CASES:
        model = _sparsity_model(**case.kwargs)
        before = _model_state(model)
        value = run_student(lambda **_: model_sparsity(model), case)
        expect(isinstance(value, (float, int)) and not isinstance(value, bool)
               or (isinstance(value, torch.Tensor) and value.numel() == 1),
               f"with {case.label}: return a number (a Python float), got {type(value).__name__}")
        problem = _state_change(before, _model_state(model))
        expect(problem is None, f"with {case.label}: the model was changed ({problem}): measure it without "
                                "modifying it (no prune.remove, no in-place operation)")
        got.append(float(value))
    for case, value in zip(SPARSITY_CASES, got):
        want = reference_sparsity(_sparsity_model(**case.kwargs))
        problem = compare(value, want, "the sparsity", dtype=torch.float32)  # a float32 mean is right
        if problem:
            why = next((why for why, f in _SPARSITY_MISTAKES if all(compare(
                v, f(_sparsity_model(**c.kwargs)), "", dtype=torch.float32) is None for c, v in zip(SPARSITY_CASES, got))),
                "count the zeros of every Conv2d and Linear weight (at any depth, each layer once, the masked weight "
                "of a pruned layer), divided by the number of those weights")
            raise CheckFailed(f"with {case.label}: {problem} -- {why}")
    return (f"the same fraction as the reference on {len(SPARSITY_CASES)} generated nested models (Embedding, "
            "LayerNorm, biases and BatchNorm with zeros of their own, a tied layer, sparsity 0 to 1, pruning masks "
            "on one layer or all), the model left as it was")
