"""Returns the outputs in the order they came back, sorted by expert: every value is some row's right answer, at the
wrong place. Family: part of the result right."""
import torch
import torch.distributed as dist

EXPECT = ["sorted by expert", "inverse"]


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
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes, group=group)
    return back
