"""Runs the forward in bfloat16: a GradScaler is for fp16."""
import torch

EXPECT = 'float16'


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.bfloat16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
