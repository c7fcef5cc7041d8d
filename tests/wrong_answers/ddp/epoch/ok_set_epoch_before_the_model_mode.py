"""Correct: set_epoch called first thing, through a local name, with a tensor accumulation of the metrics."""
import torch


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, max_steps=None, forward=None,
                step_times=None, show_bar=True):
    shuffle = sampler
    shuffle.set_epoch(epoch)
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    count = torch.zeros((), dtype=torch.int64)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach().double() * labels.numel()
        correct += (logits.argmax(1) == labels).sum()
        count += labels.numel()
    return loss_sum, correct, count
