"""Unscales, then steps with the optimizer only when the loss is finite: the loss of an overflowing step is finite,
its gradients are not, so the step is taken with inf/NaN gradients. Family: a case that cannot show the mistake (a
scale that never overflows)."""
import torch

EXPECT = ["without the scaler's step", "overflowed would not be skipped"]


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    if torch.isfinite(loss):
        optimizer.step()
    scaler.update()
    return loss.detach()
