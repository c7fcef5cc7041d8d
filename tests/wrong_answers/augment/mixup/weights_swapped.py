"""Gives each image 1 - lam of itself and lam of its partner."""


EXPECT = "weights are swapped"


def mixup_batch(images, targets, lam, perm):
    lam4 = lam.view(-1, 1, 1, 1).to(images.dtype)
    lam2 = lam.view(-1, 1).to(targets.dtype)
    return (1 - lam4) * images + lam4 * images[perm], (1 - lam2) * targets + lam2 * targets[perm]
