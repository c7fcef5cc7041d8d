"""Correct, written another way: setup_module and setup_optimizers called apart, zero_grad before each step's
micro-batches instead of after the step, the sync skipped with an is_accumulating flag, the step's loss summed as a
tensor."""
import torch.nn.functional as F


def fabric_loop(fabric, model, optimizer, loader, accumulate, steps):
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(optimizer)
    batches = iter(fabric.setup_dataloaders(loader))
    history = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0
        for i in range(accumulate):
            inputs, targets = next(batches)
            is_accumulating = i + 1 < accumulate
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                part = F.cross_entropy(model(inputs), targets) / accumulate
                fabric.backward(part)
            step_loss = step_loss + part.detach()
        optimizer.step()
        history.append(step_loss)
    return history
