"""Family: counting calls instead of their effect. no_backward_sync entered but never enabled: the gradients are all-reduced after every micro-batch; the weights are right, the communication is accumulate times what it needs to be."""
EXPECT = ['every micro-batch', 'no_backward_sync']
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(loader)
    losses, batches = [], iter(train_loader)
    for _ in range(steps):
        total = 0.0
        for micro in range(accumulate):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=False):
                loss = F.cross_entropy(model(x), y) / accumulate
                fabric.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
