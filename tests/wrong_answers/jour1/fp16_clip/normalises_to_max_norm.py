"""Rescales the gradients to a norm of exactly max_norm, also when their norm is below it: clipping only ever
scales down. Family: a case that cannot show the mistake (thresholds all below the gradient norm)."""
import torch

EXPECT = ["max_norm 3.0 x the gradient norm", "after step 1 differs"]


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    for g in grads:
        g.mul_(max_norm / norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
