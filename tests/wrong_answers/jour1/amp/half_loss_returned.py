"""Casts the loss to the autocast dtype before returning it: the loss must stay fp32."""
import torch

EXPECT = 'float32'


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels).to(dtype)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
