"""Labels the received rows as if they came sorted by local expert over all sources together; they come by source
rank, each source's rows sorted by expert. Right when one peer at most sends to this rank (2 ranks, each keeping its
own), wrong with 3 ranks sending to one. Family: inputs that never reach the mistake."""
import torch
import torch.distributed as dist

EXPECT = ["wrong rank or expert"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    send = torch.bincount(expert, minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out_sizes, in_sizes = recv.view(ep, per).sum(1).tolist(), send.view(ep, per).sum(1).tolist()
    got = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), out_sizes, in_sizes, group=group)
    y = run_local(got, torch.arange(per).repeat_interleave(recv.view(ep, per).sum(0)))
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
