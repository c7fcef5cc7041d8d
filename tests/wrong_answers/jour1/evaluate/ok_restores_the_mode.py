"""Correct: eval mode during the evaluation, the mode the model had put back afterwards, the predictions counted
with max(1).indices and torch.no_grad."""
import torch


def evaluate_fast(model, batches):
    was_training = model.training
    model.train(False)
    correct = total = 0
    with torch.no_grad():
        for images, labels in batches:
            correct += (model(images).max(1).indices == labels).sum().item()
            total += len(labels)
    model.train(was_training)
    return correct / total
