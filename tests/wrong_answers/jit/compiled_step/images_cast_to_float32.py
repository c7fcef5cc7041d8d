"""Family: inputs that never reach the mistake. The images are cast to float32 "to be safe": a float64 model
receives float32 inputs."""
import torch

EXPECT = ["float64", "it raised"]


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = loss_fn(model(images.float()), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch.compile(step, **compile_kwargs)
