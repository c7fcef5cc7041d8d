"""Computes the gradients but never calls optimizer.step()."""
import torch

EXPECT = 'parameters did not change'


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach()
