"""Correct: zero_grad before the backward, the norm clipped over model.parameters() once unscaled."""
import torch


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        logits = model(images)
        loss = criterion(logits, labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
