"""Evaluation under ``torch.inference_mode``, with optional test-time augmentation.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from dlo.training.step import autocast_context


TTA_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "hflip": lambda x: x.flip(-1),  # mirror left-right (the training augmentation's flip)
}


def _tta_views(tta: bool | Sequence[str | Callable] | None) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """``True`` -> the image and its horizontal flip; a sequence of names of :data:`TTA_VIEWS` or callables
    ``images -> images`` -> those views; ``False``/None -> no TTA (the image alone)."""
    if tta is None or tta is False:
        return [TTA_VIEWS["identity"]]
    if tta is True:
        return [TTA_VIEWS["identity"], TTA_VIEWS["hflip"]]
    if isinstance(tta, (str, bytes)) or not isinstance(tta, Sequence) or len(tta) == 0:
        raise ValueError(f"tta must be True, False or a non-empty list of views ({', '.join(TTA_VIEWS)} or "
                         f"callables), got {tta!r}")
    views = []
    for v in tta:
        if isinstance(v, str):
            if v not in TTA_VIEWS:
                raise ValueError(f"unknown TTA view {v!r}: use one of {', '.join(TTA_VIEWS)} or a callable")
            views.append(TTA_VIEWS[v])
        elif callable(v):
            views.append(v)
        else:
            raise ValueError(f"a TTA view is a name ({', '.join(TTA_VIEWS)}) or a callable, got {v!r}")
    return views


def tta_probabilities(model: nn.Module, images: torch.Tensor, tta: bool | Sequence[str | Callable] = True,
                      device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Test-time augmentation: the mean over the views of ``softmax(model(view(images)))`` (float32,
    ``[B, num_classes]``). A flipped cat is still a cat: averaging the predictions over views the model was
    trained on smooths out its view-dependent mistakes, at the price of one forward pass per view."""
    device = images.device if device is None else device
    probs = None
    views = _tta_views(tta)
    for view in views:
        with autocast_context(device, dtype):
            logits = model(view(images))
        p = torch.softmax(logits.float(), dim=1)
        probs = p if probs is None else probs + p
    return probs / len(views)


@torch.inference_mode()
def evaluate(model: nn.Module, loader, device: torch.device, dtype: torch.dtype | None = None,
             channels_last: bool = False, max_batches: int | None = None,
             tta: bool | Sequence[str | Callable] = False) -> dict[str, float]:
    """Mean loss and accuracy over ``loader``. Runs in eval mode (BatchNorm uses its running statistics,
    dropout is off) and under ``inference_mode`` (no autograd graph: less memory, faster). Counts are
    accumulated on the device and read once at the end (one synchronisation, not one per batch).

    ``tta=True``: test-time augmentation over the image and its horizontal flip (or the views listed, see
    :func:`tta_probabilities`): the prediction is the mean of the views' softmax probabilities and the loss
    is the negative log of that mean's probability for the true class."""
    was_training = model.training
    model.eval()
    use_tta = tta is not False and tta is not None
    if use_tta:
        _tta_views(tta)  # bad views fail here, in one line, before the first batch
    total_loss = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    for i, (images, labels) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if use_tta:
            probs = tta_probabilities(model, images, tta, device, dtype)
            total_loss += nn.functional.nll_loss(probs.clamp_min(1e-12).log(), labels, reduction="sum").double()
            correct += (probs.argmax(dim=1) == labels).sum()
        else:
            with autocast_context(device, dtype):
                logits = model(images)
            total_loss += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
            correct += (logits.argmax(dim=1) == labels).sum()
        seen += labels.numel()
    model.train(was_training)
    if seen == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"loss": total_loss.item() / seen, "accuracy": correct.item() / seen, "samples": seen}
