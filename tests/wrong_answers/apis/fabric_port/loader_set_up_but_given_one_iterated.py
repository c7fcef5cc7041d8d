"""Family: counting calls instead of their effect. setup_dataloaders is called, but the loop iterates the DataLoader it was given: on 2 processes every rank reads the whole dataset."""
EXPECT = ['every sample of the dataset', 'setup_dataloaders']
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(loader)
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
