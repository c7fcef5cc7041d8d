"""Family: part of the result. The step's loss recorded is the last micro-batch's, not the step's over its
micro-batches: the weights are right, the curve is not."""
EXPECT = "returned losses"
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
                fabric.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
