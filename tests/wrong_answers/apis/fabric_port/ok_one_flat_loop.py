"""Correct, written another way: one flat loop over the steps * accumulate micro-batches (zip with range stops
the loader), the optimizer stepped when the micro-batch count reaches a multiple of accumulate."""
from torch.nn import functional


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    losses, running = [], 0.0
    for count, (x, y) in zip(range(1, steps * accumulate + 1), loader):
        boundary = count % accumulate == 0
        with fabric.no_backward_sync(model, enabled=not boundary):
            loss = functional.cross_entropy(model(x), y) / accumulate
            fabric.backward(loss)
        running += loss.item()
        if boundary:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(running)
            running = 0.0
    return losses
