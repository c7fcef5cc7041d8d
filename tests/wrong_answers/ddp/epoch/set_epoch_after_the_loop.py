"""Calls set_epoch at the end of the epoch: the order of this epoch was already drawn with the previous value."""
import torch

EXPECT = ['before', 'set_epoch']


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    loss_sum, correct, count = 0.0, 0, 0
    model.train()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        out = model(images)
        loss = criterion(out, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * labels.numel()
        correct += int((out.argmax(1) == labels).sum())
        count += labels.numel()
    sampler.set_epoch(epoch)
    return loss_sum, correct, count
