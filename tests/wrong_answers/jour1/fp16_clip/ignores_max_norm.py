"""Clips to a hard-coded 1.0 instead of the max_norm argument."""
import torch

EXPECT = 'max_norm argument'


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
