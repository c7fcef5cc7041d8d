"""Clips first, then calls scaler.unscale_: the clipping saw gradients still multiplied by the loss scale."""
import torch

EXPECT = 'before unscaling'


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
