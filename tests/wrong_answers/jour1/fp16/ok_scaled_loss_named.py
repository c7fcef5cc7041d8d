"""Correct: the scaled loss kept in a variable, the gradients cleared with set_to_none=False (zeros instead of
None: the same update), the model called under torch.amp.autocast with positional arguments."""
import torch


def train_step_fp16(model, images, labels, optimizer, criterion, scaler):
    optimizer.zero_grad(set_to_none=False)
    with torch.amp.autocast(images.device.type, torch.float16):
        out = model(images)
    loss = criterion(out.float(), labels)
    scaled_loss = scaler.scale(loss)
    scaled_loss.backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
