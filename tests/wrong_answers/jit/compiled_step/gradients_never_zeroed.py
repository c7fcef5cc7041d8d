"""Family: inputs that never reach the mistake (one step would pass). No zero_grad: from the second step on the
gradients of every earlier step are added in."""
import torch

EXPECT = "zero the gradients"


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch.compile(step, **compile_kwargs)
