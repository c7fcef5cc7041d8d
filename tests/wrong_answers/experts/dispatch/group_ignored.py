"""Exchanges on the default group whatever group it is given: right whenever the group is the world (every check
that only passes group=None), wrong for an expert-parallel group inside a larger job. Family: inputs that never
reach the mistake (no explicit group)."""
import torch
import torch.distributed as dist

EXPECT = ["default group", "not on the group given"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    send = torch.bincount(expert, minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    out_sizes, in_sizes = recv.view(ep, per).sum(1).tolist(), send.view(ep, per).sum(1).tolist()
    got = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), out_sizes, in_sizes)
    y = run_local(got, torch.arange(per).repeat(ep).repeat_interleave(recv))
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes)
    out = torch.empty_like(back)
    out[order] = back
    return out
