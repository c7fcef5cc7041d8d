"""Part of the result: the counts are reduced as integers and divided with //, so the accuracy is 0."""
import torch
import torch.distributed as dist

EXPECT = 'accuracy'


def reduce_metrics(loss_sum, correct, count):
    loss_sum, correct, count = loss_sum.clone(), correct.clone(), count.clone()
    if dist.is_initialized():
        for t in (loss_sum, correct, count):
            dist.all_reduce(t)
    return {"loss": float(loss_sum / count), "accuracy": float(correct // count)}
