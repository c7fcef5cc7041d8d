"""Calls set_epoch inside the batch loop: the loader drew this epoch's order when the loop began, with the number
the sampler had then (the previous epoch's), so each epoch repeats the one before."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = ['before', 'set_epoch']


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    pass
    loss_sum, correct, count = 0.0, 0, 0
    model.train()
    for images, labels in loader:
        sampler.set_epoch(epoch)
        images, labels = images.to(device), labels.to(device)
        out = model(images)
        loss = criterion(out, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * labels.numel()
        correct += int((out.argmax(1) == labels).sum())
        count += labels.numel()
    return loss_sum, correct, count
