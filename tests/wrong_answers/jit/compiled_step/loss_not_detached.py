"""Family: part of the result right. Returns the loss with its autograd graph: the caller keeps every step's graph."""
import torch

EXPECT = "detach"


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return torch.compile(step, **compile_kwargs)
