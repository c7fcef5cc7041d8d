"""Pastes each box in a Python loop over the samples: right values, but B small copies and B reads of the corners."""
import torch

from dlo.data import augment as aug

EXPECT = "Python loop over the samples"


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
    mixed = images.clone()
    for i in range(B):
        t, b, l, rgt = int(y0[i]), int(y1[i]), int(x0[i]), int(x1[i])
        mixed[i, :, t:b, l:rgt] = images[perm[i], :, t:b, l:rgt]
    a = ((y1 - y0) * (x1 - x0) / (H * W)).to(targets.dtype)[:, None]
    return mixed, (1 - a) * targets + a * targets[perm]
