"""Sends the outputs back with the dispatch's split sizes instead of swapping them: what a rank received from a peer
is what it must return to it. Right on one process (both lists are the same), not on 2 with uneven counts. Family:
inputs that never reach the mistake."""
import torch
import torch.distributed as dist

EXPECT = ["3 processes", "swaps the two lists"]


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
    y = run_local(got, torch.arange(per).repeat(ep).repeat_interleave(recv))
    back = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), out_sizes, in_sizes, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
