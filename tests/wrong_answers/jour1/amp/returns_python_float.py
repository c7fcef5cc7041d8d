"""Returns loss.item(): a float, and a GPU sync at every step."""
import torch

EXPECT = '0-d tensor'


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()
