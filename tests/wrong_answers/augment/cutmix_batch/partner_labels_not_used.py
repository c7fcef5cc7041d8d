"""Permutes the images but mixes each label with itself: the partner's class never appears in the label."""
import torch

from dlo.data import augment as aug

EXPECT = "partner's label"


def cutmix_batch(images, targets, alpha, generator=None):
    B, _, H, W = images.shape
    perm = aug.random_partners(B, generator=generator)
    lam = aug.sample_beta(alpha, B, generator=generator)
    cy = torch.randint(H, (B,), generator=generator)
    cx = torch.randint(W, (B,), generator=generator)
    r = torch.sqrt(1 - lam)
    h, w = torch.floor(H * r).long(), torch.floor(W * r).long()
    y0, x0 = cy - h // 2, cx - w // 2
    y0, y1, x0, x1 = y0.clamp(0, H), (y0 + h).clamp(0, H), x0.clamp(0, W), (x0 + w).clamp(0, W)
    rows, cols = torch.arange(H).view(1, H, 1), torch.arange(W).view(1, 1, W)
    in_rows = (rows >= y0.view(-1, 1, 1)) & (rows < y1.view(-1, 1, 1))
    in_cols = (cols >= x0.view(-1, 1, 1)) & (cols < x1.view(-1, 1, 1))
    mixed = torch.where((in_rows & in_cols)[:, None], images[perm], images)
    a = ((y1 - y0) * (x1 - x0) / (H * W)).to(targets.dtype)[:, None]
    return mixed, (1 - a) * targets + a * targets
