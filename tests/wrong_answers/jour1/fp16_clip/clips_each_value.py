"""Clips each gradient value to [-max_norm, max_norm] (clip_grad_value_) instead of their norm."""
import torch

EXPECT = 'clipped apart'


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
