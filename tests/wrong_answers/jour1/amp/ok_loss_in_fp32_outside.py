"""Correct: only the model's forward under autocast; the loss computed in fp32 on the upcast logits."""
import torch


def train_step_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(images.device.type, dtype=dtype):
        logits = model(images)
    loss = criterion(logits.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
