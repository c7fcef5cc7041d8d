"""Worker of expert parallelism (:mod:`dlo.parallel.experts`) against one process's MoE, on ``world`` processes.

``launch(experts_worker.__file__, ["--ep", "2", "--configs", "4:2:1.0,6:1:none"], nproc=2)``: the ranks are cut
into expert-parallel groups of ``ep`` consecutive ranks (``world / ep`` groups, each a data-parallel replica
with its own batch). In every group, each rank builds the same :class:`~dlo.parallel.experts.MoEFeedForward`
(same seed) and the same global batch, keeps its slice, runs :class:`~dlo.parallel.experts.ExpertParallelMoE`
forward and backward, and compares with the reference on the whole batch (``groups=ep``): the output, the aux
loss, the statistics, the gradients of its tokens, of its experts and of the router (summed over the group).
Every call of ``torch.distributed.all_to_all_single`` is logged with the phase it ran in (forward or
backward), its dtype and the bytes it moved to other ranks. One record per rank and configuration
(``E:k:capacity_factor``); ``--llama`` adds a 2-layer MoE Llama, expert-parallel, against one process.

A configuration may go on with ``:batches`` (sequences of each group rank, ``/``-separated, zeros allowed: a rank
with no token) and ``:starve`` (a group rank whose experts no token chooses: the router's weights push them to
the bottom, so that rank receives nothing), e.g. ``4:2:none:3/0:1``. The replicated weights' gradients are
summed over the group with :func:`~dlo.parallel.experts.sum_replicated_grads`.
"""
from __future__ import annotations

import argparse

from dlo.runtime.arguments import ScriptParser, at_least, comma_list_among, parse_for_launch

DTYPE_NAMES = ("float32", "float64")


def _parse(config: str) -> tuple[int, int, float | None, list[int] | None, int | None]:
    """``E:k:capacity_factor[:batches[:starve]]`` (see the module docstring); a ValueError in one line if it is not
    one."""
    try:
        e, k, cf, *rest = config.split(":")
        batches = [int(b) for b in rest[0].split("/")] if rest and rest[0] not in ("", "-") else None
        starve = int(rest[1]) if len(rest) > 1 and rest[1] not in ("", "-") else None
        parsed = int(e), int(k), None if cf == "none" else float(cf), batches, starve
    except ValueError:
        raise ValueError(f"{config!r} is not E:k:capacity_factor[:batches[:starve]] (e.g. 4:2:1.0 or 4:2:none:3/0:1)"
                         ) from None
    experts, top_k, capacity_factor, batches, starve = parsed
    if experts < 1 or not 1 <= top_k <= experts or len(rest) > 2:
        raise ValueError(f"{config!r}: needs E >= 1 experts and 1 <= k <= E (at most 5 fields)")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"{config!r}: the capacity factor must be > 0 or none")
    if batches is not None and (min(batches) < 0 or sum(batches) == 0):
        raise ValueError(f"{config!r}: the sequences of each rank are integers >= 0, not all 0")
    return parsed


def _configs(text: str) -> list[tuple[int, int, float | None, list[int] | None, int | None]]:
    """``type=`` of ``--configs``: the comma-separated configurations, each parsed and checked."""
    try:
        return [_parse(c) for c in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="experts_worker.py", description=__doc__.splitlines()[0])
    p.add_argument("--ep", type=at_least(1), default=None, help="expert-parallel group size; default: the world size")
    p.add_argument("--configs", type=_configs, default="4:2:none,4:1:1.0,4:2:0.75",
                   help="E:k:capacity_factor[:batches[:starve]], comma-separated")
    p.add_argument("--dtypes", type=comma_list_among(DTYPE_NAMES, "dtype"), default="float32",
                   help=f"comma-separated, among {', '.join(DTYPE_NAMES)}")
    p.add_argument("--hidden", type=at_least(1), default=16)
    p.add_argument("--inter", type=at_least(1), default=24)
    p.add_argument("--batch-per-rank", type=at_least(1), default=3)
    p.add_argument("--seq", type=at_least(1), default=8)
    p.add_argument("--llama", action="store_true")
    return p


def check_args(args: argparse.Namespace, world_size: int) -> None:
    """The options against the launch's process count, before any process group: a ValueError in one line."""
    ep = args.ep or world_size
    if world_size % ep:
        raise ValueError(f"argument --ep: ep={ep} must divide the world size {world_size}")
    for experts, _, _, batches, starve in args.configs:
        if experts % ep:
            raise ValueError(f"argument --configs: {experts} experts cannot be split evenly over ep={ep} ranks")
        if batches is not None and len(batches) != ep:
            raise ValueError(f"argument --configs: batches {'/'.join(map(str, batches))} must give one size per "
                             f"rank of the group ({ep})")
        if starve is not None and not 0 <= starve < ep:
            raise ValueError(f"argument --configs: starve={starve} is not a rank of the group (0..{ep - 1})")


def checked_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, refused in one line (exit code 2) when they cannot run on this launch. Every rank finds the same
    mistake and says it: a launcher stops the other ranks at the first that fails."""
    return parse_for_launch(build_parser(), check_args, argv)


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    checked_args()

import torch
import torch.distributed as dist

from dlo.models.config import TINY_LLAMA
from dlo.models.llama import Llama, lm_loss, token_batch
from dlo.parallel.experts import (ExpertParallelMoE, MoEFeedForward, experts_of, group_sizes, moe_aux_loss, moe_llama,
                                  sum_replicated_grads)
from dlo.runtime import init_distributed, pick_device, teardown, write_record

DTYPES = {"float32": torch.float32, "float64": torch.float64}
assert tuple(DTYPES) == DTYPE_NAMES
PHASE = ["forward"]
CALLS: list[dict] = []  # every all_to_all_single of this rank: phase, dtype, rows sent to each rank, bytes


def _logging_all_to_all_single(real):
    def call(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        ep, me = dist.get_world_size(group), dist.get_rank(group)
        splits = list(input_split_sizes) if input_split_sizes else [input.shape[0] // ep] * ep
        row = input[0].numel() * input.element_size() if input.dim() > 1 and input.shape[0] else (
            input.element_size() if input.dim() == 1 else 0)
        CALLS.append({"phase": PHASE[0], "dtype": str(input.dtype).replace("torch.", ""), "rows": splits,
                      "bytes_to_others": row * sum(c for d, c in enumerate(splits) if d != me)})
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    return call


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def compare(group, ep: int, rank: int, replica: int, *, experts: int, top_k: int, capacity_factor: float | None,
            hidden: int, inter: int, batch: int, seq: int, dtype: torch.dtype, seed: int,
            batches: list[int] | None = None, starve: int | None = None,
            device: torch.device = torch.device("cpu")) -> dict:
    """``batches``: sequences of each group rank (default: ``batch`` cut evenly); ``starve``: a group rank whose
    experts get no token."""
    sizes = list(batches) if batches is not None else group_sizes(batch, ep)
    if len(sizes) != ep:
        raise ValueError(f"batches {batches} must give one size per rank of the group ({ep})")
    batch = sum(sizes)
    ref = MoEFeedForward(hidden, inter, experts, top_k, capacity_factor=capacity_factor, seed=seed).to(device, dtype)
    g = torch.Generator().manual_seed(seed * 7 + replica)  # drawn on the CPU: the same numbers on any device
    x = (torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64).to(dtype) * 4).to(device)
    w = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64).to(device, dtype)
    if starve is not None:  # a constant feature that the router's row of every starved expert weighs -30
        x[..., 0] = 1.0
        with torch.no_grad():
            ref.router.weight[list(experts_of(starve, experts, ep)), 0] = -30.0
    mine = ExpertParallelMoE(ref, group)
    ref_x = x.clone().requires_grad_()
    ref_out = ref(ref_x, groups=[s * seq for s in sizes])
    ((ref_out * w).sum() + 0.5 * ref.aux_loss).backward()
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    my_x = x[lo:hi].clone().requires_grad_()
    CALLS.clear()
    PHASE[0] = "forward"
    out = mine(my_x)
    PHASE[0] = "backward"
    ((out * w[lo:hi]).sum() + 0.5 * mine.aux_loss).backward()
    PHASE[0] = "forward"
    # the router is replicated, each rank holding its tokens' share of the gradient: summed over the group
    assert sum_replicated_grads(mine, group) == ["router.weight"]
    router_grad = mine.router.weight.grad
    local = experts_of(rank, experts, ep)
    expert_err = max(_err(p.grad, q.grad) for j, e in enumerate(local)
                     for p, q in zip(mine.experts[j].parameters(), ref.experts[e].parameters()))
    same_stats = all(mine.stats[k] == ref.stats[k] for k in ("tokens", "tokens_per_expert", "kept_per_expert",
                                                              "dropped", "dropped_tokens", "imbalance"))
    return {"case": "compare", "experts": experts, "top_k": top_k, "capacity_factor": capacity_factor,
            "ep": ep, "replica": replica, "group_rank": rank, "dtype": str(dtype).replace("torch.", ""),
            "batches": sizes, "starve": starve,
            "hidden": hidden, "local_tokens": (hi - lo) * seq, "local_experts": list(local),
            "out": _err(out, ref_out[lo:hi]), "aux": abs(float(mine.aux_loss.detach()) - float(ref.aux_loss.detach())),
            "aux_loss": float(ref.aux_loss.detach()), "dx": _err(my_x.grad, ref_x.grad[lo:hi]),
            "drouter": _err(router_grad, ref.router.weight.grad), "dexperts": expert_err,
            "same_stats": same_stats, "stats": mine.stats, "ref_stats": ref.stats, "comm": dict(mine.comm),
            "calls": list(CALLS)}


def llama_case(group, ep: int, rank: int, replica: int, seed: int, device: torch.device = torch.device("cpu")) -> dict:
    """A 2-layer Llama with a MoE in each block, expert-parallel over the group, against one process."""
    cfg = TINY_LLAMA.replace(num_layers=2, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2,
                             vocab_size=64, head_dim=None)
    batch = 2 * ep
    tokens, labels = token_batch(batch, 8, cfg.vocab_size, seed=seed + replica)
    tokens, labels = tokens.to(device), labels.to(device)
    ref = moe_llama(Llama(cfg, seed=seed), 4 if 4 % ep == 0 else 2 * ep, 2, capacity_factor=1.0, groups=ep,
                    seed=seed).to(device)
    mine = moe_llama(Llama(cfg, seed=seed), 4 if 4 % ep == 0 else 2 * ep, 2, capacity_factor=1.0, seed=seed,
                     ep_group=group, expert_parallel=True).to(device)
    ref_logits = ref(tokens)
    (lm_loss(ref_logits, labels) * batch + 0.01 * moe_aux_loss(ref)).backward()
    lo, hi = rank * 2, rank * 2 + 2
    logits = mine(tokens[lo:hi])
    (lm_loss(logits, labels[lo:hi]) * 2 + 0.01 * moe_aux_loss(mine)).backward()
    replicated = sum_replicated_grads(mine, group)  # embeddings, attention, norms, routers: summed over the group
    want = dict(ref.named_parameters())
    experts = [(p, want[f"layers.{i}.mlp.experts.{e}.{name}"])
               for i, block in enumerate(mine.layers) for j, e in enumerate(block.mlp.local)
               for name, p in block.mlp.experts[j].named_parameters()]
    return {"case": "llama", "ep": ep, "replica": replica, "group_rank": rank,
            "logits": _err(logits, ref_logits[lo:hi]),
            "aux": abs(float(moe_aux_loss(mine).detach()) - float(moe_aux_loss(ref).detach())),
            "dembed": _err(mine.embed_tokens.weight.grad, ref.embed_tokens.weight.grad),
            "dreplicated": max(_err(p.grad, want[name].grad) for name, p in mine.named_parameters()
                               if name in replicated),
            "drouters": max(_err(p.grad, want[name].grad) for name, p in mine.named_parameters()
                            if name.endswith("mlp.router.weight")),
            "dexperts": max(_err(p.grad, q.grad) for p, q in experts), "replicated": len(replicated)}


def main(argv: list[str] | None = None) -> None:
    args = checked_args(argv)
    torch.set_num_threads(1)
    dist.all_to_all_single = _logging_all_to_all_single(dist.all_to_all_single)
    # one GPU per process with NCCL on a GPU node, gloo on CPU processes elsewhere
    init_distributed(timeout_s=120)
    device = pick_device()
    try:
        world, me = dist.get_world_size(), dist.get_rank()
        ep = args.ep or world
        groups = [dist.new_group(list(range(s, s + ep))) for s in range(0, world, ep)]  # every rank makes each
        group = groups[me // ep] if ep < world else None
        replica, rank = me // ep, me % ep
        for experts, top_k, cf, batches, starve in args.configs:
            for dtype in args.dtypes:
                write_record(compare(group, ep, rank, replica, experts=experts, top_k=top_k, capacity_factor=cf,
                                     hidden=args.hidden, inter=args.inter, batch=args.batch_per_rank * ep,
                                     seq=args.seq, dtype=DTYPES[dtype], seed=experts * 10 + top_k,
                                     batches=batches, starve=starve, device=device))
        if args.llama:
            write_record(llama_case(group, ep, rank, replica, seed=3, device=device))
        dist.barrier()
    finally:
        teardown()


if __name__ == "__main__":
    main()
