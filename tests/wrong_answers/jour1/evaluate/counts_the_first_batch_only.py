"""Returns inside the loop: only the first batch is counted. Right when there is one batch. Family: a case that
cannot show the mistake (one batch, or batches that agree)."""
import torch

EXPECT = ["called 1 time for", "once on each batch"]


def evaluate_fast(model, batches):
    model.eval()
    with torch.inference_mode():
        for images, labels in batches:
            correct = (model(images).argmax(dim=1) == labels).sum().item()
            return correct / labels.numel()
