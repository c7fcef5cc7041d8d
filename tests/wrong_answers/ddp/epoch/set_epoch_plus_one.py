"""Calls set_epoch(epoch + 1), "for the next epoch": the shuffle is not the one of this epoch number."""
import torch

EXPECT = 'during epoch'


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, show_bar=True):
    sampler.set_epoch(epoch + 1)
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
    return loss_sum, correct, count
