"""Passes the loss to clip_grad_norm_ instead of the parameters: the gradients are left as they are."""
import torch

EXPECT = 'not clipped'


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(loss, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
