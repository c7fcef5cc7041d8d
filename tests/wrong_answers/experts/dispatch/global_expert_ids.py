"""Labels the received rows with global expert ids: right on one process (every expert is local there), wrong as
soon as a rank holds experts 2 and 3. Family: inputs that never reach the mistake (one process)."""
import torch
import torch.distributed as dist

EXPECT = ["local expert ids"]


def dispatch_combine(rows, expert, num_experts, run_local, group=None):
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    per = num_experts // ep
    order = torch.argsort(expert, stable=True)
    send = torch.bincount(expert, minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out_sizes, in_sizes = recv.view(ep, per).sum(1).tolist(), send.view(ep, per).sum(1).tolist()
    got = rows.new_empty((sum(out_sizes), rows.shape[1]))
    dist.all_to_all_single(got, rows[order].contiguous(), out_sizes, in_sizes, group=group)
    mine = torch.arange(rank * per, (rank + 1) * per)
    y = run_local(got, mine.repeat(ep).repeat_interleave(recv))
    back = rows.new_empty((sum(in_sizes), rows.shape[1]))
    dist.all_to_all_single(back, y.contiguous(), in_sizes, out_sizes, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
