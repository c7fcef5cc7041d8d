"""Family: a flag instead of the behaviour. Only the model goes through fabric.setup; the optimizer steps unwrapped.
On one CPU device nothing changes numerically, which is why it must be caught from the calls."""
EXPECT = "optimizer was not set up"
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model = fabric.setup(model)
    loader = fabric.setup_dataloaders(loader)
    losses, batches = [], iter(loader)
    for _ in range(steps):
        total = 0.0
        for micro in range(accumulate):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=micro < accumulate - 1):
                loss = F.cross_entropy(model(x), y) / accumulate
                fabric.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
