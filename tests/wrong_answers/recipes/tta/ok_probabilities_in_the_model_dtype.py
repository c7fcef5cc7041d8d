"""Correct: the softmax taken in the model's own dtype (no cast to float32), the views' probabilities summed in a loop
and divided by their number."""
import torch


def tta_predict(model, images):
    views = (images, torch.flip(images, dims=[-1]))
    total = 0
    for view in views:
        total = total + model(view).softmax(dim=1)
    return total / len(views)
