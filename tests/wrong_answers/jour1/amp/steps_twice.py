"""Calls optimizer.step() twice "to make sure it is applied": every update is doubled (with momentum, more than
doubled). Family: values checked (the parameters change, as a flag-style check wants), their size not."""
import torch

EXPECT = ["after step 1 differs"]


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    optimizer.step()
    return loss.detach()
