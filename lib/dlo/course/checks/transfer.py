"""Checkers of Jour3/transfer.ipynb (course ``transfer``): a new head on a frozen backbone, and the
parameter groups of fine-tuning (a small learning rate for the pretrained backbone).

Each step runs on the four backbones of :mod:`.transfer_cases` (different widths, layers with and without a bias,
BatchNorm and LayerNorm, layers named ``mlp.fc1`` inside the backbone, a head that is not the last child), next to the
reference applied to the same weights: the head's sizes, which parameters are trainable, the model's output and every
parameter's gradient (present where the reference has one, equal values); for the groups, each parameter's group and
learning rate, then two SGD steps with the student's groups and the reference's, every parameter compared after.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.cases import compare
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.transfer_cases import BACKBONES, build, copy_head, images, same_effect

TRANSFER_NB = "Jour3/transfer.ipynb"

#: (backbone index, n_classes): a head of one class and heads smaller and larger than the pretrained one.
_HEAD_CASES = ((0, 4), (1, 1), (2, 3), (3, 17))
#: (backbone index, head_lr, backbone_lr)
_GROUP_CASES = ((0, 0.05, 0.005), (1, 0.1, 1e-4), (2, 3e-3, 3e-5), (3, 1.0, 0.25))


def _call(fn: Callable, label: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported, in one line
        raise CheckFailed(f"with {label}: it raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")


def _reference_freeze(model: nn.Module) -> None:
    model.requires_grad_(False)
    model.fc.requires_grad_(True)


def _check_new_head(replace_head: Callable, index: int, n: int) -> None:
    label = f"{BACKBONES[index][0]}, n_classes={n}"
    model, ref = build(index), build(index)
    old_fc = model.fc
    before = {k: p.detach().clone() for k, p in model.named_parameters() if not k.startswith("fc.")}
    out = _call(replace_head, label, model, n)
    expect(out is model, f"with {label}: return the model you were given (changed in place)")
    fc = model.fc
    expect(isinstance(fc, nn.Linear) and fc is not old_fc, f"with {label}: replace model.fc by a new nn.Linear")
    expect(fc.in_features == old_fc.in_features, f"with {label}: the new head takes {fc.in_features} features, the "
           f"backbone gives {old_fc.in_features} (the old head's in_features)")
    expect(fc.out_features == n, f"with {label}: the new head must output n_classes = {n} logits, got "
           f"{fc.out_features}")
    expect(fc.bias is not None, f"with {label}: the new head has no bias: the pretrained head had one (a bias per "
           "class)")
    now = dict(model.named_parameters())
    changed = [k for k, p in before.items() if k not in now or not torch.equal(now[k].detach(), p)]
    expect(not changed, f"with {label}: only the head changes: {changed[0] if changed else ''} changed, the backbone "
           "keeps its pretrained weights")
    ref.fc = nn.Linear(ref.fc.in_features, n)
    copy_head(fc, ref.fc)
    extra = sorted(set(now) - set(dict(ref.named_parameters())))
    expect(not extra, f"with {label}: the model has parameters the reference does not: {extra[:3]}")
    problem = same_effect(model, ref, images())
    expect(problem is None, f"with {label}, the new head given the same weights as the reference's: {problem}")


def _check_freeze(freeze_backbone: Callable, replace_head: Callable, index: int) -> None:
    label = BACKBONES[index][0]
    model, ref = build(index), build(index)
    out = _call(freeze_backbone, label, model)
    expect(out is model, f"with {label}: freeze_backbone: return the model you were given")
    _reference_freeze(ref)
    want = {k: p.requires_grad for k, p in ref.named_parameters()}
    got = {k: p.requires_grad for k, p in model.named_parameters()}
    head_frozen = [k for k in want if want[k] and not got.get(k, False)]
    expect(not head_frozen, f"with {label}: {head_frozen[0] if head_frozen else ''} is frozen: the head (fc.weight, "
           "fc.bias) must stay trainable")
    trainable = [k for k in want if got.get(k) and not want[k]]
    more = f" (and {len(trainable) - 1} more)" if len(trainable) > 1 else ""
    expect(not trainable, f"with {label}: {trainable[0] if trainable else ''}{more} stays trainable: requires_grad "
           "must be False on every backbone parameter (norm layers included), only the head (fc.weight, fc.bias) "
           "keeps it")
    problem = same_effect(model, ref, images(1))
    expect(problem is None, f"with {label}, frozen: {problem}")
    _call(replace_head, label, model, 3)
    expect(all(p.requires_grad for p in model.fc.parameters()),
           f"with {label}: a head created after freezing must be trainable (a new nn.Linear is)")


@register("transfer", "head", ("replace_head", "freeze_backbone"), TRANSFER_NB)
def _check_head(replace_head: Callable, freeze_backbone: Callable) -> str:
    for index, n in _HEAD_CASES:
        _check_new_head(replace_head, index, n)
    for index in range(len(BACKBONES)):
        _check_freeze(freeze_backbone, replace_head, index)
    return (f"a new Linear head of the right size on {len(BACKBONES)} backbones; only the head is trainable; the "
            "outputs and every parameter's gradient equal the reference's")


def _reference_groups(model: nn.Module, head_lr: float, backbone_lr: float) -> list[dict]:
    head = {id(p) for p in model.fc.parameters()}
    return [{"params": [p for p in model.parameters() if id(p) not in head], "lr": backbone_lr},
            {"params": list(model.fc.parameters()), "lr": head_lr}]


def _lr_by_name(model: nn.Module, groups: Any, label: str) -> dict[str, float]:
    expect(isinstance(groups, list) and len(groups) == 2 and all(isinstance(g, dict) for g in groups),
           f"with {label}: return a list of two dicts: [{{'params': backbone, 'lr': backbone_lr}}, "
           "{'params': head, 'lr': head_lr}]")
    names = {id(p): k for k, p in model.named_parameters()}
    lr: dict[str, float] = {}
    for g in groups:
        expect("params" in g and "lr" in g, f"with {label}: each group is a dict with 'params' and 'lr'")
        expect(isinstance(g["params"], (list, tuple)),
               f"with {label}: give each group's 'params' as a list, got a {type(g['params']).__name__}: a generator "
               "is used up by the first pass over it (the optimizer's), and the group is empty for anything that "
               "reads it again")
        for p in g["params"]:
            name = names.get(id(p), "a tensor that is not a parameter of the model")
            expect(name not in lr, f"with {label}: {name} is in two groups: a parameter must appear in one group only")
            lr[name] = g["lr"]
    missing = [k for k in names.values() if k not in lr]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    expect(not missing, f"with {label}: {missing[0] if missing else ''}{more} is in no group: every parameter of the "
           "model must be in a group")
    return lr


def _check_groups_case(finetune_param_groups: Callable, index: int, head_lr: float, backbone_lr: float) -> None:
    label = f"{BACKBONES[index][0]}, head_lr={head_lr:g}, backbone_lr={backbone_lr:g}"
    model, ref = build(index), build(index)
    groups = _call(finetune_param_groups, label, model, head_lr, backbone_lr)
    lr = _lr_by_name(model, groups, label)
    head = [k for k, _ in model.named_parameters() if k.startswith("fc.")]
    for k in head:
        expect(lr[k] == head_lr, f"with {label}: {k} (the head, model.fc) has lr {lr[k]:g}, expected head_lr = "
               f"{head_lr:g}")
    for k, value in lr.items():
        expect(k in head or value == backbone_lr, f"with {label}: {k} (backbone: everything but model.fc) has lr "
               f"{value:g}, expected the small backbone_lr = {backbone_lr:g}")
    mine = torch.optim.SGD(groups, lr=1.0, momentum=0.9)
    theirs = torch.optim.SGD(_reference_groups(ref, head_lr, backbone_lr), lr=1.0, momentum=0.9)
    for step in range(2):
        for m, opt in ((model, mine), (ref, theirs)):
            opt.zero_grad(set_to_none=True)
            m(images(step)).square().mean().backward()
            opt.step()
    want = dict(ref.named_parameters())
    for k, p in model.named_parameters():
        problem = compare(p.detach(), want[k].detach(), k)
        expect(problem is None, f"with {label}, after two SGD steps (momentum 0.9) on your groups and on the "
               f"reference's: {problem}")


@register("transfer", "groups", ("finetune_param_groups",), TRANSFER_NB)
def _check_groups(finetune_param_groups: Callable) -> str:
    for case in _GROUP_CASES:
        _check_groups_case(finetune_param_groups, *case)
    return (f"two groups on {len(_GROUP_CASES)} backbones: the pretrained backbone at a small learning rate, the new "
            "head at the full one; two SGD steps equal the reference's")
