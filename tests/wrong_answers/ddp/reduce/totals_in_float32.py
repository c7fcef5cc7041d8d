"""Part of the result: one all-reduce of the three totals, but in a float32 tensor (torch.tensor's default): the loss
sum loses digits (invisible when the sums are small whole numbers)."""
import torch
import torch.distributed as dist

EXPECT = 'float32'


def reduce_metrics(loss_sum, correct, count):
    totals = torch.tensor([float(loss_sum), float(correct), float(count)])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    loss, right, seen = totals.tolist()
    return {"loss": loss / seen, "accuracy": right / seen, "samples": int(seen)}
