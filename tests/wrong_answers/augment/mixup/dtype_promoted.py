"""Mixes with a float32 lam: bfloat16 images come back as float32, twice the memory."""


EXPECT = "promoted"


def mixup_batch(images, targets, lam, perm):
    lam4 = lam.view(-1, 1, 1, 1)
    lam2 = lam.view(-1, 1)
    return lam4 * images + (1 - lam4) * images[perm], lam2 * targets + (1 - lam2) * targets[perm]
