"""Computes the loss in fp32: no torch.autocast at all."""
import torch

EXPECT = 'autocast'


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    loss = criterion(model(images), labels)

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
