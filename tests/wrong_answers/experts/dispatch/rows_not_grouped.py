"""Sends the rows in the caller's order, with the split sizes of the grouped rows: the slices no longer hold the rows
of one destination, so rows reach the wrong rank or expert. Family: a step skipped (the grouping)."""
import torch
import torch.distributed as dist

EXPECT = ["wrong rank or expert"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    send = torch.bincount(expert, minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out_sizes, in_sizes = recv.view(ep, per).sum(1).tolist(), send.view(ep, per).sum(1).tolist()
    got = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows.contiguous(), out_sizes, in_sizes, group=group)
    y = run_local(got, torch.arange(per).repeat(ep).repeat_interleave(recv))
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes, group=group)
    return back
