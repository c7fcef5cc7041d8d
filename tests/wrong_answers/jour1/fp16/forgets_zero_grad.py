"""Never clears the gradients: the first step is right, the second adds its (scaled) gradients to the first's.
Family: a case that cannot show the mistake (one step on a fresh model)."""
import torch

EXPECT = ["after step 2 differs"]


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
