"""torch.compile(step) without **compile_kwargs: the backend or mode asked for is ignored."""
import torch

EXPECT = 'pass compile_kwargs on'


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch.compile(step)
