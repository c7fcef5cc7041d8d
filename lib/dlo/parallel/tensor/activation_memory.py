"""Activation memory of the regions sequence parallelism splits: what autograd saves inside them (measured), the
formula for the norms, and the sentences that state the outcome from the measurements."""
from __future__ import annotations

from typing import Any

import torch


def saved_bytes_inside(modules, fn) -> dict[str, Any]:
    """Run ``fn()`` and count the tensors autograd saves for the backward *while one of* ``modules`` *runs its
    forward* (``saved_tensors_hooks``), each storage once (two views of one tensor are one allocation),
    parameters left out (they are not activations). Returns ``{"bytes", "tensors": [(shape, bytes), ...],
    "out"}`` (``out``: what ``fn`` returned, so that its backward can still run).

    With the norms of a :class:`TPLlama` as ``modules``, this is the activation memory of the regions that
    sequence parallelism splits (the residual adds save nothing; the residual stream is the norms' input)."""
    modules = list(modules)
    params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    depth, seen, saved = [0], set(), []

    def enter(module, args):
        depth[0] += 1

    def leave(module, args, out):
        depth[0] -= 1

    def pack(t: torch.Tensor) -> torch.Tensor:
        if depth[0] > 0:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen and ptr not in params:
                seen.add(ptr)
                saved.append((tuple(t.shape), t.untyped_storage().nbytes()))
        return t

    handles = [h for m in modules for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
    finally:
        for h in handles:
            h.remove()
    return {"bytes": sum(b for _, b in saved), "tensors": saved, "out": out}


def norm_saved_bytes_theory(num_layers: int, batch: int, seq: int, hidden: int, tp: int = 1, *,
                            sequence_parallel: bool = False, element_size: int = 4) -> int:
    """What the ``2L + 1`` RMSNorms of a :class:`TPLlama` save for the backward on one rank, for activations of
    ``element_size`` bytes: per norm its input converted to float32 (``x.float()``: ``x`` itself in float32, a copy
    in 16 bits), the float32 ``rsqrt(mean x² + eps)`` (one number per token) and the normalised ``x`` back in
    the activations' dtype (what the weight multiplies): ``batch · tokens · (hidden · (4 + element_size) + 4)``
    bytes, where ``tokens`` is the whole sequence with plain TP and ``seq / tp`` with sequence parallelism."""
    tokens = seq // tp if sequence_parallel else seq
    per_norm = batch * tokens * (hidden * (4 + element_size) + 4)
    return (2 * num_layers + 1) * per_norm


def _kib(n: float) -> str:
    return f"{n / 2**10:,.1f} KiB"


def sp_memory_sentence(tp: int, tp_bytes: int, sp_bytes: int, formula_sp_bytes: int | None = None) -> str:
    """One sentence on the norms' saved bytes of one rank, plain TP against SP, written from the measured numbers
    (and the formula's, when given)."""
    head = (f"At tp={tp}, the norms of one rank keep {_kib(sp_bytes)} for the backward with sequence parallelism "
            f"against {_kib(tp_bytes)} with plain TP")
    if sp_bytes >= tp_bytes:
        return f"{head}: no saving."
    if sp_bytes * tp == tp_bytes:
        how = f"exactly 1/{tp}"
    else:
        how = f"{tp_bytes / sp_bytes:.2f}x less, not the {tp}x that splitting the sequence in {tp} would give"
    if formula_sp_bytes is not None:
        how += (", the formula's number to the byte" if formula_sp_bytes == sp_bytes
                else f" (the formula says {_kib(formula_sp_bytes)})")
    return f"{head}: {how}."


def sp_comm_sentence(tp: int, tp_rows: list[dict[str, Any]], sp_rows: list[dict[str, Any]]) -> str:
    """One sentence on the collectives of one step, plain TP against SP (rows of ``COUNTER.rows()``, phases
    forward and backward), written from the counts: the loss's all-reduces are in both and cancel out."""
    def total(rows, op, what):
        return sum(r[what] for r in rows if r["op"] == op and r["phase"] in ("forward", "backward"))

    ar_calls = total(tp_rows, "all_reduce", "calls") - total(sp_rows, "all_reduce", "calls")
    ar_bytes = total(tp_rows, "all_reduce", "bytes") - total(sp_rows, "all_reduce", "bytes")
    rs, ag = total(sp_rows, "reduce_scatter", "calls"), total(sp_rows, "all_gather", "calls")
    sp_bytes = total(sp_rows, "reduce_scatter", "bytes") + total(sp_rows, "all_gather", "bytes")
    head = (f"At tp={tp}, one step of plain TP ran {ar_calls} all-reduces of activations ({ar_bytes / 2**20:.2f} MiB); "
            f"sequence parallelism ran {rs} reduce-scatters and {ag} all-gathers instead "
            f"({sp_bytes / 2**20:.2f} MiB, each counted as the full tensor)")
    if ar_bytes and sp_bytes == 2 * ar_bytes:
        return (f"{head}: exactly twice, that is the same traffic, since a ring all-reduce is a reduce-scatter "
                f"followed by an all-gather.")
    ratio = sp_bytes / ar_bytes if ar_bytes else float("inf")
    return f"{head}: {ratio:.2f}x the all-reduced bytes, not the 2x of the same traffic."
