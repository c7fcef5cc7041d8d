"""Hard-codes device_type="cuda": right for a batch on a GPU, but on a CPU batch the forward runs without autocast
(CUDA autocast does not touch CPU operations; on a machine without CUDA it is disabled with a warning). Family: a
flag set (an autocast is entered), the behaviour wrong on the device the batch is on."""
import torch

EXPECT = ["device_type='cuda'", "the batch is on cpu"]


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type="cuda", dtype=dtype):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
