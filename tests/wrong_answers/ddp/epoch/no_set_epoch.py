"""Never calls sampler.set_epoch: every epoch repeats epoch 0's order."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'never told the epoch'


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    pass
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
