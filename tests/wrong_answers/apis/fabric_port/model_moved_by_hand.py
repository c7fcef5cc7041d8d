"""Family: a flag instead of the behaviour. The model moved to the device by hand before the set-up, as in the
native loop."""
EXPECT = "moves the model itself"
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model = model.to(fabric.device)
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
        losses.append(total)
    return losses
