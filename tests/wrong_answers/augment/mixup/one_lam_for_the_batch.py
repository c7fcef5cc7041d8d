"""Uses lam[0] for the whole batch, as torchvision does: each image has its own lam here."""


EXPECT = "its own lam"


def mixup_batch(images, targets, lam, perm):
    lam0 = float(lam[0])
    return lam0 * images + (1 - lam0) * images[perm], lam0 * targets + (1 - lam0) * targets[perm]
