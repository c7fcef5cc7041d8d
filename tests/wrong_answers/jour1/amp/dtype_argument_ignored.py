"""Hard-codes bfloat16: the dtype argument is never used (right only when bf16 is asked)."""
import torch

EXPECT = 'dtype argument'


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=torch.bfloat16):
        loss = criterion(model(images), labels)

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
