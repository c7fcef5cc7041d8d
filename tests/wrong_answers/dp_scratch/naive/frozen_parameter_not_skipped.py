"""All-reduces every parameter's .grad, frozen ones included: a frozen layer has no gradient (None)."""
import torch.distributed as dist

EXPECT = ["frozen", "requires_grad=False", "skipped"]


def allreduce_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(dist.get_world_size())
