"""Calls scaler.scale(loss) but then loss.backward(): the gradients are unscaled, scaler.step divides them again (update 256x too small)."""
import torch

EXPECT = 'unscaled loss'


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)

    scaler.scale(loss)
    loss.backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
