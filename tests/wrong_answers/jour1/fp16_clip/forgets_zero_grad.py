"""Never clears the gradients: the second step clips the sum of both steps' gradients. Family: a case that cannot
show the mistake (one step on a fresh model)."""
import torch

EXPECT = ["after step 2 differs"]


def train_step_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
