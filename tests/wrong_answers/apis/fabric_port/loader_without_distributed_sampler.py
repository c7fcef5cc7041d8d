"""Family: counting calls instead of their effect. The loader goes through setup_dataloaders with use_distributed_sampler=False: every rank still reads the whole dataset."""
EXPECT = ['every sample of the dataset', 'distributed sampler']
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    losses, batches = [], iter(train_loader)
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
