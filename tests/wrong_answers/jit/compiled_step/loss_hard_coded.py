"""Family: inputs that never reach the mistake. The loss is written as cross-entropy inside the step instead of the
loss_fn passed in: right as long as the caller trains a classifier with plain cross-entropy."""
import torch
import torch.nn.functional as F

EXPECT = "whatever loss_fn is"


def make_compiled_step(model, optimizer, loss_fn, **compile_kwargs):
    def step(images, labels):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch.compile(step, **compile_kwargs)
