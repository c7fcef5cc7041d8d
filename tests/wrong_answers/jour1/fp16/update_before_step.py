"""Calls scaler.update() before scaler.step(): the scale changes before it is used."""
import torch

EXPECT = 'in that order'


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)

    scaler.scale(loss).backward()
    scaler.update()
    scaler.step(optimizer)
    return loss.detach()
