"""Never exchanges the counts: assumes each rank receives from every peer as many rows as it sends to it. True on
one process, and whenever the routing happens to be symmetric; not with uneven counts. Family: inputs that never
reach the mistake (one process, even counts)."""
import torch
import torch.distributed as dist

EXPECT = ["3 processes", "expects", "the counts each peer sends"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    send = torch.bincount(expert, minlength=num_experts)
    sizes = send.view(ep, per).sum(1).tolist()
    got = rows.new_empty((sum(sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), sizes, sizes, group=group)
    y = run_local(got, torch.arange(per).repeat(ep).repeat_interleave(send))
    back = rows.new_empty((sum(sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), sizes, sizes, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
