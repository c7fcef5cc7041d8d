"""Soft targets: integer labels one-hot encoded, and the loss and accuracy of a batch whose targets are mixtures
of classes (MixUp / CutMix, :mod:`dlo.data.augment`), where the usual ``argmax == label`` has no meaning."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _is_label_vector(targets: torch.Tensor, num_classes: int | None) -> bool:
    """True for integer labels ``[B]``, False for soft targets ``[B, K]``; one clear error for anything else."""
    if targets.ndim == 1 and not targets.dtype.is_floating_point:
        if num_classes is None:
            raise ValueError("integer labels [B] need num_classes to be one-hot encoded")
        return True
    if targets.ndim == 2 and targets.dtype.is_floating_point:
        if num_classes is not None and targets.shape[1] != num_classes:
            raise ValueError(f"targets have {targets.shape[1]} classes but num_classes={num_classes}")
        return False
    raise ValueError(f"targets must be integer labels [B] or float soft targets [B, K], got dtype {targets.dtype} "
                     f"and shape {tuple(targets.shape)}")


def to_soft_targets(targets: torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """Targets as floating point ``[B, K]``: integer labels ``[B]`` are one-hot encoded (float32, needs
    ``num_classes``), soft / one-hot targets ``[B, K]`` pass through."""
    if _is_label_vector(targets, num_classes):
        return F.one_hot(targets.long(), num_classes).to(torch.float32)
    return targets


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Mix in at least float32: bfloat16 / float16 are rounded once, at the end."""
    return torch.promote_types(dtype, torch.float32)


def soft_cross_entropy(logits: torch.Tensor, soft_targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``-sum_k t_k log softmax(logits)_k``.

    With one-hot targets this is the usual cross-entropy; with mixed targets it is the cross-entropy
    against the mixture, i.e. ``lam * CE(a) + (1 - lam) * CE(b)``. Equal to
    ``F.cross_entropy(logits, soft_targets)`` (probability targets); written out to show what it computes.
    Computed in float32 at least (log-softmax in bfloat16 loses too much).
    """
    if soft_targets.ndim == 1 and not soft_targets.dtype.is_floating_point:
        soft_targets = to_soft_targets(soft_targets, logits.shape[-1])
    if soft_targets.shape != logits.shape:
        raise ValueError(f"soft targets {tuple(soft_targets.shape)} and logits {tuple(logits.shape)} differ in shape")
    log_p = F.log_softmax(logits.to(_compute_dtype(logits.dtype)), dim=-1)
    return -(soft_targets.to(log_p.dtype) * log_p).sum(dim=-1).mean()


def soft_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Accuracy that also understands soft targets; a 0-dim tensor (no device synchronisation).

    * integer labels ``[B]``: the usual ``mean(argmax == label)``;
    * soft targets ``[B, K]``: ``mean_i targets[i, argmax_i]``, the *expected* accuracy when the mixed
      image counts as class ``a`` with probability ``lam`` and ``b`` with ``1 - lam``: predicting ``a``
      scores ``lam``, ``b`` scores ``1 - lam``, anything else 0. For one-hot targets it is the usual accuracy.

    Why not the naive ``(logits.argmax(1) == targets).float().mean()``: with ``targets`` of shape
    ``[B, K]`` the comparison broadcasts ``[B]`` against ``[B, K]`` (a ``[B, K]`` or ``[K, K]``-like table,
    or a shape error) and compares class *indices* with *probabilities* (e.g. ``3 == 0.7``): the result
    is 0 or a number with no meaning. ``targets.argmax(1)`` is defined but discards the mixture (it
    rewards predicting the dominant class only).
    """
    pred = logits.argmax(dim=-1)
    if targets.ndim == 1 and not targets.dtype.is_floating_point:
        return (pred == targets).float().mean()
    if targets.ndim != 2 or targets.shape != logits.shape:
        raise ValueError(f"targets must be integer labels [B] or soft targets shaped like the logits "
                         f"{tuple(logits.shape)}, got {targets.dtype} {tuple(targets.shape)}")
    return targets.gather(1, pred[:, None]).squeeze(1).float().mean()
