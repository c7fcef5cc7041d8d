"""Correct: the gradients are cleared after the optimizer's step instead of before the backward (step();
zero_grad()): every backward still starts from empty gradients."""
import torch


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return torch.compile(step, **compile_kwargs)
