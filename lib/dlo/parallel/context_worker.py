"""Worker of ring attention (:mod:`dlo.parallel.context`) against one process's SDPA, on ``cp`` processes.

``launch(context_worker.__file__, ["--seq", "48"], nproc=cp)``: every rank builds the same random ``q, k, v``
of the whole sequence (same seed), keeps its shard, runs :func:`~dlo.parallel.context.ring_attention`, and
compares its output and the gradients of its shard of ``q, k, v`` with
``torch.nn.functional.scaled_dot_product_attention`` on the whole sequence, sharded the same way. One record
per rank and configuration (causal or not, layout, heads / K/V heads, dtype): the largest differences, the
block counts and the ring batches posted. ``--torch-cp`` also tries PyTorch's own
``torch.distributed.tensor.experimental.context_parallel`` and records whether it runs here.
"""
from __future__ import annotations

import argparse

from dlo.runtime.arguments import ScriptParser, at_least, comma_list_among, parse_for_launch

DTYPE_NAMES = ("float32", "float64")
LAYOUTS = ("balanced", "contiguous")  # dlo.parallel.context's layouts: the sequence in 2·cp or cp chunks


def _head_pairs(text: str) -> list[tuple[int, int]]:
    """``type=`` of ``--heads``: ``heads:kv_heads`` pairs, comma-separated, heads a multiple of kv_heads."""
    pairs = []
    for pair in text.split(","):
        try:
            heads, kv_heads = (int(x) for x in pair.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{pair!r} is not heads:kv_heads (e.g. 4:2)") from None
        if heads < 1 or kv_heads < 1 or heads % kv_heads:
            raise argparse.ArgumentTypeError(f"{pair!r}: num_heads={heads} must be a positive multiple of "
                                             f"num_kv_heads={kv_heads} (>= 1)")
        pairs.append((heads, kv_heads))
    return pairs


def build_parser() -> ScriptParser:
    p = ScriptParser(prog="context_worker.py", description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=at_least(1), default=48)
    p.add_argument("--batch", type=at_least(1), default=2)
    p.add_argument("--dim", type=at_least(1), default=16)
    p.add_argument("--heads", type=_head_pairs, default="4:4,4:2,6:1", help="heads:kv_heads pairs, comma-separated")
    p.add_argument("--layouts", type=comma_list_among(LAYOUTS, "layout"), default="balanced,contiguous")
    p.add_argument("--dtypes", type=comma_list_among(DTYPE_NAMES, "dtype"), default="float32")
    p.add_argument("--causal", type=comma_list_among(("1", "0")), default="1,0", help="1 (causal), 0 (not), comma-separated")
    p.add_argument("--torch-cp", action="store_true")
    return p


def check_args(args: argparse.Namespace, cp: int) -> None:
    """The sequence against the launch's ``cp`` processes: every layout cuts it in equal chunks."""
    for layout in args.layouts:
        n = 2 * cp if layout == "balanced" else cp
        if args.seq % n:
            raise ValueError(f"argument --seq: sequence length {args.seq} must be a multiple of {n} to be "
                             f"split into {n} equal chunks over cp={cp} ranks ({layout} layout)")


def checked_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, refused in one line (exit code 2, on every rank) before any process group."""
    return parse_for_launch(build_parser(), check_args, argv)


if __name__ == "__main__":  # a bad option is one line here, before torch is imported or any process group starts
    checked_args()

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlo.parallel.context import repeat_kv, ring_attention, shard
from dlo.runtime import init_distributed, pick_device, teardown, write_record

DTYPES = {"float32": torch.float32, "float64": torch.float64}
assert tuple(DTYPES) == DTYPE_NAMES


def inputs(batch: int, heads: int, kv_heads: int, seq: int, dim: int, dtype: torch.dtype, seed: int,
           device: torch.device | str = "cpu"):
    """Q, K, V and the loss weights, drawn on the CPU (the same numbers on every device), then moved."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, kv_heads, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, kv_heads, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64).to(dtype)  # loss = (out * w).sum()
    return tuple(t.to(device) for t in (q, k, v, w))


POSTED: list[list[tuple[str, int]]] = []  # every batch this rank posted: [(isend | irecv, peer), ...]


def _logging_batch_isend_irecv(real):
    def post(ops):
        POSTED.append([(op.op.__name__, op.peer) for op in ops])
        return real(ops)
    return post


def compare(cp: int, rank: int, *, batch: int, heads: int, kv_heads: int, seq: int, dim: int, causal: bool,
            layout: str, dtype: torch.dtype, seed: int, device: torch.device | str = "cpu") -> dict:
    q, k, v, w = inputs(batch, heads, kv_heads, seq, dim, dtype, seed, device)
    ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(ref_q, repeat_kv(ref_k, heads), repeat_kv(ref_v, heads), is_causal=causal)
    (ref * w).sum().backward()
    mine = [shard(t, cp, rank, layout).requires_grad_() for t in (q, k, v)]
    stats: dict = {}
    POSTED.clear()
    out = ring_attention(*mine, causal=causal, layout=layout, stats=stats)
    forward_posted = list(POSTED)
    POSTED.clear()
    (out * shard(w, cp, rank, layout)).sum().backward()
    backward_posted = list(POSTED)

    def err(a, b):
        return float((a - shard(b, cp, rank, layout)).abs().max())

    return {"case": "compare", "causal": causal, "layout": layout, "heads": heads, "kv_heads": kv_heads,
            "seq": seq, "dtype": str(dtype).replace("torch.", ""), "out": err(out.detach(), ref.detach()),
            "dq": err(mine[0].grad, ref_q.grad), "dk": err(mine[1].grad, ref_k.grad),
            "dv": err(mine[2].grad, ref_v.grad), "stats": stats, "local_seq": out.shape[-2],
            "posted": {"forward": forward_posted, "backward": backward_posted}}


def torch_context_parallel(cp: int, rank: int, seq: int, device: torch.device | str = "cpu") -> dict:
    """PyTorch's context_parallel on this backend and device, if it runs: its max difference with SDPA."""
    rec: dict = {"case": "torch_cp", "available": False, "runs": False, "error": ""}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        rec["available"] = True
    except ImportError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    try:
        mesh = init_device_mesh(torch.device(device).type, (cp,))
        q, k, v, _ = inputs(1, 4, 4, seq, 16, torch.float32, 0, device)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        cq, ck, cv = q.clone(), k.clone(), v.clone()
        with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
        rec["runs"] = True
        rec["local_seq"] = out.shape[2]
        rec["out_vs_sdpa_local_rows"] = out.shape == ref.shape
    except Exception as exc:  # noqa: BLE001 - the point is to record what happens here
        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return rec


def main(argv: list[str] | None = None) -> None:
    args = checked_args(argv)
    torch.set_num_threads(1)
    dist.batch_isend_irecv = _logging_batch_isend_irecv(dist.batch_isend_irecv)  # what is posted together
    # one GPU per process with NCCL on a GPU node (the semantics the ring is written for), gloo on CPUs elsewhere
    init_distributed(timeout_s=120)
    device = pick_device()
    try:
        cp, rank = dist.get_world_size(), dist.get_rank()
        for layout in args.layouts:
            for causal in (c == "1" for c in args.causal):
                for heads, kv_heads in args.heads:
                    for dtype in args.dtypes:
                        write_record(compare(cp, rank, batch=args.batch, heads=heads, kv_heads=kv_heads,
                                             seq=args.seq, dim=args.dim, causal=causal, layout=layout,
                                             dtype=DTYPES[dtype], seed=len(f"{heads}:{kv_heads}") + args.seq,
                                             device=device))
        if args.torch_cp:
            write_record(torch_context_parallel(cp, rank, args.seq, device))
        dist.barrier()
    finally:
        teardown()


if __name__ == "__main__":
    main()
