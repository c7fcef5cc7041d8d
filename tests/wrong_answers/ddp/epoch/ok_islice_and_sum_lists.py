"""Correct: the sampler told the epoch before the loader is iterated, max_steps through itertools.islice, the
metrics kept as Python numbers and turned into tensors at the end."""
import itertools
import time

import torch

from dlo.runtime import synchronize


def train_epoch(model, loader, sampler, epoch, optimizer, criterion, device, *, max_steps=None, forward=None,
                step_times=None, show_bar=True):
    sampler.set_epoch(epoch)
    model.train()
    loss_sum, correct, count = 0.0, 0, 0
    for step, (images, labels) in enumerate(itertools.islice(loader, max_steps)):
        start = time.perf_counter()
        images, labels = images.to(device), labels.to(device)
        logits = model(images) if forward is None else forward(model, images, step)
        loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step_times is not None:
            synchronize(device)
            step_times.append(time.perf_counter() - start)
        loss_sum += loss.item() * labels.numel()
        correct += int((logits.argmax(dim=1) == labels).sum())
        count += labels.numel()
    return (torch.tensor(loss_sum, dtype=torch.float64, device=device),
            torch.tensor(correct, dtype=torch.int64, device=device), torch.tensor(count, dtype=torch.int64, device=device))
