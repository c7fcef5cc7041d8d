"""Divides by the number of batches times the first batch's size: wrong when the last batches are smaller."""
import torch

EXPECT = 'number of images'


def evaluate_fast(model, batches):
    model.eval()
    correct, batch_size, n = 0, None, 0
    with torch.inference_mode():
        for images, labels in batches:
            batch_size = batch_size or len(labels)
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            n += 1
    return correct / (n * batch_size)
