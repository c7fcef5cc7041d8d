"""Clips the gradient of each parameter to max_norm on its own: their total norm can still be up to sqrt(number of
parameters) x max_norm. Family: part of the result right (every tensor's norm is bounded), the whole not."""
import torch

EXPECT = ["gradient of each parameter was clipped apart"]


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    for p in model.parameters():
        torch.nn.utils.clip_grad_norm_([p], max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
