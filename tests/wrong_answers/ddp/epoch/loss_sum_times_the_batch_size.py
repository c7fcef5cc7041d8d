"""Inputs that never reach the mistake: each batch's mean loss multiplied by the loader's batch_size, not by the
batch's own size: wrong for the last, smaller batch (a dataset that divides by the batch never shows it)."""
import torch
from torch import nn

EXPECT = 'loss_sum'


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    sampler.set_epoch(epoch)
    loss_sum, correct, count = 0.0, 0, 0
    model.train()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        out = model(images)
        loss = criterion(out, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * loader.batch_size
        correct += int((out.argmax(1) == labels).sum())
        count += labels.numel()
    return torch.tensor(loss_sum, dtype=torch.float64), torch.tensor(correct), torch.tensor(count)
