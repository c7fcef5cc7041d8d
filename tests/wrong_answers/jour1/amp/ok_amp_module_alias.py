"""Correct: torch.amp.autocast (the same class as torch.autocast), the device type and dtype passed by position,
the logits and the loss computed in two statements inside the block."""
import torch


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    optimizer.zero_grad()
    with torch.amp.autocast(images.device.type, dtype):
        logits = model(images)
        loss = criterion(logits, labels)
    loss.backward()
    optimizer.step()
    return loss.detach()
