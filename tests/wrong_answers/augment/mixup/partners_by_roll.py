"""Pairs each image with its neighbour (images.roll(1, 0), torchvision's way) instead of the given perm."""


EXPECT = "not the perm you are given"


def mixup_batch(images, targets, lam, perm):
    lam4 = lam.view(-1, 1, 1, 1).to(images.dtype)
    lam2 = lam.view(-1, 1).to(targets.dtype)
    return (lam4 * images + (1 - lam4) * images.roll(1, 0),
            lam2 * targets + (1 - lam2) * targets.roll(1, 0))
