"""Family: counting calls instead of their effect. no_backward_sync enabled on every micro-batch: the ranks never average their gradients, each trains on its own share (weights 0.1-0.2 away from the reference's)."""
EXPECT = ['never average']
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(loader)
    losses, batches = [], iter(train_loader)
    for _ in range(steps):
        total = 0.0
        for micro in range(accumulate):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=True):
                loss = F.cross_entropy(model(x), y) / accumulate
                fabric.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
