"""Returns the scaled loss (what the backward ran on): the loss logged is the scale times too large. Family: part of
the result checked (a tensor is returned), its value not."""
import torch

EXPECT = ["the loss returned by step 1 differs", "expected 2.3"]


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    return scaled.detach()
