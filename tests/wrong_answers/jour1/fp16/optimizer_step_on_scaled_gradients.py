"""Steps with optimizer.step(): the gradients are still multiplied by the scale."""
import torch

EXPECT = "scaler's step"


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)

    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
    return loss.detach()
