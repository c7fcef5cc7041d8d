"""Correct: the whole step inside the autocast block (the backward runs the ops autocast chose in the forward, so
it computes the same gradients), the gradients cleared first, the loss returned detached."""
import torch


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    optimizer.zero_grad()
    with torch.autocast(device_type=images.device.type, dtype=dtype, enabled=True):
        out = model(images)
        loss = criterion(out, labels)
        loss.backward()
        optimizer.step()
    return loss.detach()
