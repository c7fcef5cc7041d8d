"""Sends expert e's rows to rank e // ep (the number of ranks) instead of e // (experts per rank): the same rank when
there are as many experts per rank as ranks (4 experts on 2 ranks), the wrong one otherwise. Family: inputs that
never reach the mistake (two sizes that happen to be equal)."""
import torch
import torch.distributed as dist

EXPECT = ["on the way out", "cuts its rows as", "experts are held by those ranks as"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    send = torch.bincount(expert, minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out_sizes = recv.view(ep, per).sum(1).tolist()
    in_sizes = torch.bincount(expert // ep, minlength=ep)[:ep].tolist()
    got = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), out_sizes, in_sizes, group=group)
    y = run_local(got, torch.arange(per).repeat(ep).repeat_interleave(recv))
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
