"""Hands the batch to aug.cutmix instead of building the boxes, the mask and the label weights."""

from dlo.data import augment as aug

EXPECT = "yourself"


def cutmix_batch(images, targets, alpha, generator=None):
    B, _, H, W = images.shape
    params = aug.sample_mix_params(B, alpha, kind="cutmix", height=H, width=W, generator=generator)
    return aug.cutmix(images, targets, params)
