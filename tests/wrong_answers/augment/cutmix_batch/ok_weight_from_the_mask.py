"""Correct: the mask is built from two 1-D comparisons, and each label weight is the mask's own mean."""
import torch
from dlo.data import augment as aug


def cutmix_batch(images, targets, alpha, generator=None):
    B, _, H, W = images.shape
    perm = aug.random_partners(B, generator=generator)
    lam = aug.sample_beta(alpha, B, generator=generator)
    cy = torch.randint(H, (B,), generator=generator)
    cx = torch.randint(W, (B,), generator=generator)

    r = (1 - lam).sqrt()
    h, w = (H * r).floor().long(), (W * r).floor().long()
    top, left = cy - h // 2, cx - w // 2
    y0, y1 = top.clamp(0, H), (top + h).clamp(0, H)
    x0, x1 = left.clamp(0, W), (left + w).clamp(0, W)
    rows = torch.arange(H)[None, :]
    cols = torch.arange(W)[None, :]
    in_rows = (rows >= y0[:, None]) & (rows < y1[:, None])        # [B, H]
    in_cols = (cols >= x0[:, None]) & (cols < x1[:, None])        # [B, W]
    mask = in_rows[:, :, None] & in_cols[:, None, :]              # [B, H, W]
    mixed = torch.where(mask.unsqueeze(1), images[perm], images)
    a = mask.flatten(1).double().mean(1).to(targets.dtype).unsqueeze(1)
    return mixed, targets * (1 - a) + targets[perm] * a
