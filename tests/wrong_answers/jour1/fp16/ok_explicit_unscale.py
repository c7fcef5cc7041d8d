"""Correct: an explicit unscale_ before the scaler's step (the step then does not unscale again)."""
import torch


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
