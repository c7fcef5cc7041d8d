"""Casts the images to float32 before the model, as for a float32 model: a bfloat16 model gets inputs of another
dtype."""
import torch

EXPECT = ["bfloat16", "raised"]


def tta_predict(model, images):
    x = images.float()
    views = [x, x.flip(-1)]
    return torch.stack([torch.softmax(model(v).float(), dim=1) for v in views]).mean(dim=0)
