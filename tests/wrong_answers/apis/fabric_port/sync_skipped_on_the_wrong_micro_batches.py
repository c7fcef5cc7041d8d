"""Family: counting calls instead of their effect. no_backward_sync is entered on every micro-batch but with the condition turned round: the gradients are all-reduced on the first micro-batch and not on the last, so the ranks step on different gradients."""
EXPECT = ['all-reduced after micro-batches [0, 3]', 'expected after [2, 5]']
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(loader)
    losses, batches = [], iter(train_loader)
    for _ in range(steps):
        total = 0.0
        for micro in range(accumulate):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=micro > 0):
                loss = F.cross_entropy(model(x), y) / accumulate
                fabric.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
