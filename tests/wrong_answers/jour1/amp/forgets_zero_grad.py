"""Never clears the gradients: right on a fresh model (its gradients are None), but from the second step on each
backward adds to the previous step's gradients. Family: a case that cannot show the mistake (one step only)."""
import torch

EXPECT = ["after step 2 differs", "batch"]


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.detach()
