"""Family: inputs that never reach the mistake. The DataLoader is used as it is: on one process identical, on N
processes every one of them would read the whole dataset."""
EXPECT = "setup_dataloaders"
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    pass
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
