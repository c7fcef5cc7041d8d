"""Squeezes the logits to drop a size-1 dimension: with a batch of one image the batch dimension goes too."""
import torch

EXPECT = ["batch of 1", "shape"]


def tta_predict(model, images):
    p = torch.softmax(model(images).squeeze(), dim=-1)
    q = torch.softmax(model(images.flip(-1)).squeeze(), dim=-1)
    return (p + q) / 2
