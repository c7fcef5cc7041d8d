"""Mixes under torch.no_grad() ("an augmentation needs no gradient"): right values, but nothing mixed this way can be
trained through (MixUp of features inside a network gets no gradient)."""
import torch

EXPECT = ["gradient of images", "missing"]


def mixup_batch(images, targets, lam, perm):
    with torch.no_grad():
        lam4 = lam.view(-1, 1, 1, 1).to(images.dtype)
        lam2 = lam.view(-1, 1).to(targets.dtype)
        return lam4 * images + (1 - lam4) * images[perm], lam2 * targets + (1 - lam2) * targets[perm]
