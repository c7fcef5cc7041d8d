"""Family: a flag set but the behaviour wrong. torch.compile is called inside the step, so every call builds a new
compiled function (and recompiles): the values are right, nothing is reused."""
import torch

EXPECT = "called again while the step ran"


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def run(images, labels):
        return torch.compile(step, **compile_kwargs)(images, labels)

    return run
