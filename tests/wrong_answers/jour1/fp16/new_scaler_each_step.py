"""Builds a fresh GradScaler inside the step and ignores the one passed in: the scale starts over at every step, so
it never settles (after an overflow it is back at its initial value). Family: the right calls, on the wrong object."""
import torch

EXPECT = ["scaler passed in was never called"]


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    scaler = torch.amp.GradScaler(images.device.type)
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
