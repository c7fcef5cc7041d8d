"""Correct: the box as a float mask (the outer product of a row and a column indicator), the images blended with it
instead of torch.where, each label weight from the clipped box's area."""
import torch
from dlo.data import augment as aug


def cutmix_batch(images, targets, alpha, generator=None):
    B, _, H, W = images.shape
    perm = aug.random_partners(B, generator=generator)
    lam = aug.sample_beta(alpha, B, generator=generator)
    cy = torch.randint(H, (B,), generator=generator)
    cx = torch.randint(W, (B,), generator=generator)
    side = torch.sqrt(1 - lam)
    h, w = (H * side).floor().long(), (W * side).floor().long()
    y0, y1 = (cy - h // 2).clamp(0, H), (cy - h // 2 + h).clamp(0, H)
    x0, x1 = (cx - w // 2).clamp(0, W), (cx - w // 2 + w).clamp(0, W)
    ys, xs = torch.arange(H), torch.arange(W)
    row = ((ys >= y0[:, None]) & (ys < y1[:, None])).to(images.dtype)  # [B, H]
    col = ((xs >= x0[:, None]) & (xs < x1[:, None])).to(images.dtype)  # [B, W]
    mask = torch.einsum("bh,bw->bhw", row, col)[:, None]               # [B, 1, H, W]
    mixed = images * (1 - mask) + images[perm] * mask
    a = ((y1 - y0) * (x1 - x0)).to(targets.dtype)[:, None] / (H * W)
    return mixed, (1 - a) * targets + a * targets[perm]
