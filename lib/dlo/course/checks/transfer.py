"""Checkers of Jour3/transfer.ipynb (course ``transfer``): a new head on a frozen backbone, and the
parameter groups of fine-tuning (a small learning rate for the pretrained backbone)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks.framework import expect, register
from dlo.models.resnets import resnet18_cifar

TRANSFER_NB = "Jour3/transfer.ipynb"


def _tiny_resnet(num_classes: int = 6) -> nn.Module:

    torch.manual_seed(0)
    return resnet18_cifar(num_classes=num_classes, width=4)


@register("transfer", "head", ("replace_head", "freeze_backbone"), TRANSFER_NB)
def _check_head(replace_head: Callable, freeze_backbone: Callable) -> str:
    model = _tiny_resnet(6)
    old_fc = model.fc
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("fc.")}
    out = replace_head(model, 4)
    expect(out is model, "return the model you were given (changed in place)")
    expect(isinstance(model.fc, nn.Linear) and model.fc is not old_fc, "replace model.fc by a new nn.Linear")
    expect(model.fc.in_features == old_fc.in_features,
            f"the new head takes the backbone's {old_fc.in_features} features (model.fc.in_features)")
    expect(model.fc.out_features == 4, f"the new head must output n_classes = 4 logits, got {model.fc.out_features}")
    expect(model.fc.bias is not None, "the new head has no bias: the pretrained head had one (a bias per class)")
    expect(all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if n in before),
            "only the head changes: the backbone keeps its pretrained weights")
    expect(model(torch.randn(2, 3, 32, 32)).shape == (2, 4), "the model must now output [batch, 4]")

    model = _tiny_resnet(6)
    out = freeze_backbone(model)
    expect(out is model, "freeze_backbone: return the model you were given")
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    backbone = [n for n in trainable if not n.startswith("fc.")]
    expect(trainable == ["fc.bias", "fc.weight"],
            f"only the head (fc.weight, fc.bias) must stay trainable, got {(backbone or trainable)[:4]}"
            f"{' ...' if len(backbone or trainable) > 4 else ''} trainable too (requires_grad must be False on "
            "every backbone parameter, BatchNorm's included; eval mode does not freeze anything)")
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    expect(model.conv1.weight.grad is None and model.fc.weight.grad is not None,
            "backward must give gradients to the head only")
    replace_head(model, 3)
    expect(model.fc.weight.requires_grad, "a head created after freezing must be trainable (a new nn.Linear is)")
    return "a new Linear head of the right size; only the head is trainable, the backbone gets no gradients"


@register("transfer", "groups", ("finetune_param_groups",), TRANSFER_NB)
def _check_groups(finetune_param_groups: Callable) -> str:
    model = _tiny_resnet(4)
    groups = finetune_param_groups(model, 0.05, 0.005)
    expect(isinstance(groups, list) and len(groups) == 2 and all(isinstance(g, dict) for g in groups),
            "return a list of two dicts: [{'params': backbone, 'lr': backbone_lr}, {'params': head, 'lr': head_lr}]")
    by_id = {}
    for g in groups:
        expect("params" in g and "lr" in g, "each group is a dict with 'params' and 'lr'")
        expect(isinstance(g["params"], (list, tuple)),
               f"give each group's 'params' as a list, got a {type(g['params']).__name__}: a generator is used up by "
               "the first pass over it (the optimizer's), and the group is empty for anything that reads it again")
        for p in g["params"]:
            expect(id(p) not in by_id, "a parameter must appear in one group only")
            by_id[id(p)] = g["lr"]
    expect(len(by_id) == len(list(model.parameters())), "every parameter of the model must be in a group")
    head = {id(model.fc.weight), id(model.fc.bias)}
    expect(all(by_id[i] == 0.05 for i in head), "the head (model.fc) gets head_lr (0.05 here)")
    expect(all(lr == 0.005 for i, lr in by_id.items() if i not in head),
            "the backbone (everything but model.fc) gets the small backbone_lr (0.005 here)")
    opt = torch.optim.SGD(groups, lr=1.0, momentum=0.9)
    expect(sorted(g["lr"] for g in opt.param_groups) == [0.005, 0.05], "the groups must work as an optimizer's input")
    return "two groups: the pretrained backbone at a small learning rate, the new head at the full one"
