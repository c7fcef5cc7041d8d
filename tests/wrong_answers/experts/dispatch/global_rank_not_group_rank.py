"""Sends the global expert ids with the rows and makes them local with the process's global rank: right in the
default group (a rank's place in it is its global rank), wrong in a group of ranks [1, 2]. Family: inputs that never
reach the mistake (no explicit group)."""
import torch
import torch.distributed as dist

EXPECT = ["local expert ids", "rank in the group"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep = dist.get_world_size(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    sent_to = torch.bincount(expert // per, minlength=ep)
    came_from = torch.empty_like(sent_to)
    dist.all_to_all_single(came_from, sent_to, group=group)
    sent_to, came_from = sent_to.tolist(), came_from.tolist()
    got = rows.new_empty((sum(came_from), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), came_from, sent_to, group=group)
    ids = expert.new_empty(sum(came_from))
    dist.all_to_all_single(ids, expert[order].contiguous(), came_from, sent_to, group=group)
    y = run_local(got, ids - dist.get_rank() * per)
    back = rows.new_empty((sum(sent_to), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), sent_to, came_from, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
