"""Calls sampler.set_epoch(0): the same shuffle at every epoch."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'during epoch'


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    sampler.set_epoch(0)
    loss_sum, correct, count = 0.0, 0, 0
    model.train()
    for images, labels in loader:
        pass
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
