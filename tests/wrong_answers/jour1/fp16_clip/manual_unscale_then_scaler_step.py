"""Divides the gradients by the scale by hand instead of scaler.unscale_: scaler.step then unscales them again."""
import torch

EXPECT = 'divided them by it by hand'


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= scaler.get_scale()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
