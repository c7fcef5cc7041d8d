"""Family: a flag set but the behaviour wrong. zero_grad is called, but between backward and step: the update
uses zero gradients and the weights never move."""
import torch

EXPECT = "in that order"


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.zero_grad(set_to_none=False)
        optimizer.step()
        return loss.detach()

    return torch.compile(step, **compile_kwargs)
