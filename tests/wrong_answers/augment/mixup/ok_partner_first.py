"""Correct: the partner's share added to the sample, each weight broadcast with reshape in the tensor's own dtype."""


def mixup_batch(images, targets, lam, perm):
    lam = lam.to(images.device)
    li = lam.reshape(-1, *([1] * (images.ndim - 1))).to(images.dtype)
    lt = lam.reshape(-1, 1).to(targets.dtype)
    mixed = images + (1 - li) * (images[perm] - images)
    return mixed, targets + (1 - lt) * (targets[perm] - targets)
