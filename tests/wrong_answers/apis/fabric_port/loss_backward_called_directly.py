"""Family: a flag instead of the behaviour. loss.backward() instead of fabric.backward(loss): same numbers on one
CPU device, no loss scaling and no strategy backward on GPUs."""
EXPECT = ["fabric.backward", "0 time"]
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    losses, batches = [], iter(loader)
    for _ in range(steps):
        total = 0.0
        for micro in range(accumulate):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=micro < accumulate - 1):
                loss = F.cross_entropy(model(x), y) / accumulate
                loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
