"""Computes cross-entropy itself instead of calling the criterion it is given: right only while the criterion is
plain cross-entropy. Family: an argument the fixed case never varied."""
import torch
import torch.nn.functional as F

EXPECT = ["criterion smooth", "the loss returned by step 1"]


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
