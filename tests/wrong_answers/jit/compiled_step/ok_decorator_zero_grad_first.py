"""Correct: torch.compile used as a decorator with the caller's options, gradients cleared before the forward."""
import torch


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    @torch.compile(**compile_kwargs)
    def train_step(images, labels):
        optimizer.zero_grad()
        out = model(images)
        loss = loss_fn(out, labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return train_step
