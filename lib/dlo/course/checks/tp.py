"""Checkers of tp_tensor_parallel/tp_balises.py (``dlo check tp <n>``, n = 1..12).

Each checker first calls the student's code in this process, without a process group (tp = 1: every
primitive is the identity, every parallel layer must equal its full layer): that catches an unfinished
balise at once. What only shows with real peers (slices, sums over the right group, gradients, how many
all-reduces) is then checked by ONE 4-process gloo run of :mod:`dlo.course.checks.tp_worker` (its cases are in
:mod:`dlo.course.tp_cases`: tp = 2 on a strided TP group of a 2 x 2 TP x DP layout, tp = 4, tp = 3 on a subset of
the processes and tp = 1, float32 and float64, sizes drawn per seed, values and gradients), which checks the asked
balise only (its verdict is cached per script content and balise): starting the processes and making their groups
costs about half a second, the twelve balises' cases together about 2.5 s on 2 cores.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register, peer_records
from dlo.models.llama import SwiGLU
from dlo.models.llama import Attention, rotary_cos_sin
from dlo.models.llama import Llama, token_batch
from dlo.models.config import TransformerConfig

SCRIPT = "tp_tensor_parallel/tp_balises.py"
WORKER = Path(__file__).with_name("tp_worker.py")
_CACHE: dict[str, dict[str, str]] = {}


def _script_of(obj: Any) -> Path:
    fn = obj
    if isinstance(obj, type):
        fn = next((v for v in vars(obj).values() if callable(v) and hasattr(v, "__code__")), None)
        if fn is None:
            for v in vars(obj).values():
                if isinstance(v, staticmethod):
                    fn = v.__func__
                    break
    code = getattr(fn, "__code__", None)
    path = Path(code.co_filename) if code else Path("?")
    expect(path.suffix == ".py" and path.is_file(),
            "the balises must be defined in a script file (tp_balises.py) so that 4 processes can import it")
    return path


def _peers(objs: Any, balise: str, where: str = "on 4 processes") -> None:
    """The 4-process verdict on ``balise`` for the script defining ``objs`` (one launch per script content and balise).
    When they come from several scripts (an answer that reuses the workbook's script and redefines one of
    them), the one that is not the workbook's is checked."""
    scripts = list(dict.fromkeys(_script_of(o) for o in (objs if isinstance(objs, tuple) else (objs,))))
    others = [p for p in scripts if not p.resolve().as_posix().endswith(SCRIPT)]
    script = (others or scripts)[0]
    key = f"{script}:{hashlib.sha256(script.read_bytes()).hexdigest()}:{balise}"
    if key not in _CACHE:
        records = peer_records(WORKER, [str(script), balise], 4)
        merged: dict[str, str] = {}
        for r in sorted(records, key=lambda r: r["rank"]):
            for n, verdict in r["results"].items():
                # first failing rank, preferring the one that saw the failure itself
                echo = "(seen on another rank)" in verdict
                if verdict != "ok" and (merged.get(n, "ok") == "ok" or (not echo and "(seen on another rank)" in merged[n])):
                    merged[n] = f"rank {r['rank']}: {verdict}"
                merged.setdefault(n, verdict)
        _CACHE.clear()
        _CACHE[key] = merged
    verdict = _CACHE[key].get(balise, "no answer from the 4-process run")
    if "NotImplementedError" in verdict:
        raise NotImplementedError(verdict.split("NotImplementedError:", 1)[-1].strip())
    expect(verdict == "ok", f"{where}: {verdict.replace('Bad: ', '')}")


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() <= tol)


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@register("tp", "1", ("copy_to_region", "reduce_from_region", "gather_from_region", "scatter_to_region"), SCRIPT)
def _check_1(copy_to_region: Callable, reduce_from_region: Callable, gather_from_region: Callable,
             scatter_to_region: Callable) -> str:
    for name, fn in (("copy_to_region", copy_to_region), ("reduce_from_region", reduce_from_region),
                     ("gather_from_region", gather_from_region), ("scatter_to_region", scatter_to_region)):
        x = _x(2, 3, seed=1).requires_grad_()
        y = fn(x, None)
        expect(isinstance(y, torch.Tensor) and torch.equal(y, x), f"{name}: with one process, the forward is the identity")
        (y * 3).sum().backward()
        expect(x.grad is not None and torch.equal(x.grad, torch.full_like(x, 3.0)),
                f"{name}: with one process, the backward passes the gradient through unchanged")
    _peers((copy_to_region, reduce_from_region, gather_from_region, scatter_to_region), "1")
    return "f / g / gather / scatter: right forward, right backward, one counted collective each, on the given group"


@register("tp", "2", ("ColumnParallelLinear",), SCRIPT)
def _check_2(ColumnParallelLinear: type) -> str:
    torch.manual_seed(0)
    full = nn.Linear(6, 8)
    layer = ColumnParallelLinear(full, None)
    expect(isinstance(getattr(layer, "weight", None), nn.Parameter) and isinstance(getattr(layer, "bias", None), nn.Parameter),
            "keep the slices as nn.Parameter attributes named weight and bias")
    expect(layer.weight.data_ptr() != full.weight.data_ptr(), "clone the slice: the layer must own its weights")
    x = _x(2, 6)
    expect(_close(layer(x), full(x)), "with one process the layer must equal the full nn.Linear")
    _peers(ColumnParallelLinear, "2")
    return "output features split, input gradient all-reduced, optional gather"


@register("tp", "3", ("RowParallelLinear",), SCRIPT)
def _check_3(RowParallelLinear: type) -> str:
    torch.manual_seed(0)
    full = nn.Linear(8, 6)
    layer = RowParallelLinear(full, None)
    for name in ("weight", "bias"):
        mine, theirs = getattr(layer, name, None), getattr(full, name)
        expect(isinstance(mine, nn.Parameter), "keep the slice and the bias as nn.Parameter attributes named weight "
                                               "and bias")
        expect(mine.untyped_storage().data_ptr() != theirs.untyped_storage().data_ptr(),
               f"clone the {name}: the layer must own its weights, not a view of the full layer's")
    x = _x(2, 8)
    expect(_close(layer(x), full(x)), "with one process the layer must equal the full nn.Linear")
    _peers(RowParallelLinear, "3")
    return "input features split, partial outputs all-reduced, bias added once"


@register("tp", "4", ("VocabParallelEmbedding",), SCRIPT)
def _check_4(VocabParallelEmbedding: type) -> str:
    torch.manual_seed(0)
    full = nn.Embedding(10, 4)
    ids = torch.tensor([[0, 9, 4]])
    expect(_close(VocabParallelEmbedding(full, None)(ids), full(ids)), "with one process it must equal nn.Embedding")
    _peers(VocabParallelEmbedding, "4")
    return "vocabulary split, ids of other ranks masked, one all-reduce"


@register("tp", "5", ("ParallelSwiGLU",), SCRIPT)
def _check_5(ParallelSwiGLU: type) -> str:

    torch.manual_seed(0)
    full = SwiGLU(8, 12)
    x = _x(2, 3, 8)
    expect(_close(ParallelSwiGLU(full, None)(x), full(x)), "with one process it must equal dlo.models.llama.SwiGLU")
    _peers(ParallelSwiGLU, "5")
    return "gate/up column-parallel, down row-parallel: one all-reduce forward, one backward"


@register("tp", "6", ("ParallelAttention",), SCRIPT)
def _check_6(ParallelAttention: type) -> str:

    cos, sin = rotary_cos_sin(5, 4)
    # num_heads * head_dim (32) != hidden (20), several K/V heads (GQA groups of 2)
    for hidden, heads, kv in ((16, 4, 2), (20, 8, 4)):
        torch.manual_seed(0)
        full = Attention(hidden, heads, kv, 4)
        x = _x(2, 5, hidden)
        try:
            got = ParallelAttention(full, None)(x, cos, sin)
        except NotImplementedError:
            raise
        except RuntimeError as exc:  # a view/reshape to the wrong width
            raise CheckFailed(f"hidden {hidden}, {heads} heads / {kv} K/V heads of 4: {str(exc).splitlines()[0][:100]}"
                              " -- q has num_heads / tp heads and k, v num_kv_heads / tp heads (GQA), each head_dim "
                              "wide: the heads' width is num_heads * head_dim, not hidden") from None
        expect(_close(got, full(x, cos, sin)),
               f"with one process it must equal dlo.models.llama.Attention (hidden {hidden}, {heads} heads of 4, "
               f"{kv} K/V heads: the heads' width is num_heads * head_dim, not hidden)")
    _peers(ParallelAttention, "6")
    return "query and K/V heads split (GQA groups kept), one all-reduce per forward, clear error when tp ∤ heads"


def _tiny_llama():

    cfg = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    return Llama(cfg, seed=0), token_batch(2, 8, 64, seed=1)


@register("tp", "7", ("TPLlama",), SCRIPT)
def _check_7(TPLlama: type) -> str:
    ref, (ids, labels) = _tiny_llama()
    model = TPLlama(ref, None)
    names = [n for n, _ in model.named_parameters()]
    expect(names == [n for n, _ in ref.named_parameters()], f"keep Llama's parameter names (got {names[:3]}...)")
    expect(_close(model(ids), ref(ids)), "with one process the logits must equal the Llama's")
    with torch.no_grad():
        gap = abs(float(model.loss(ids, labels, vocab_parallel=False)) - float(ref.loss(ids, labels)))
    expect(gap < 1e-5,
            "with one process the loss must equal the Llama's")
    # Llama 3.2 ties the head to the embedding: a config that ties them must stay tied (one tensor, not a copy)
    tied_ref = Llama(dataclasses.replace(ref.cfg, tie_embeddings=True), seed=0)
    tied = TPLlama(tied_ref, None)
    expect(getattr(getattr(tied, "lm_head", None), "weight", None) is getattr(tied.embed_tokens, "weight", 0),
           "with cfg.tie_embeddings (Llama 3.2 ties them) lm_head.weight must BE embed_tokens.weight, not a copy")
    expect([n for n, _ in tied.named_parameters()] == [n for n, _ in tied_ref.named_parameters()],
           "with cfg.tie_embeddings keep the tied model's parameter names (the head shares the embedding)")
    # Llama 3 gives head_dim explicitly: num_heads * head_dim (here 4 x 4) need not be the hidden size (32)
    wide_ref = Llama(dataclasses.replace(ref.cfg, head_dim=4), seed=0)
    wide = "with head_dim=4 given (num_heads * head_dim = 16, hidden 32) the logits differ"
    try:
        got = TPLlama(wide_ref, None)(ids)
    except RuntimeError as exc:  # rotary tables of the wrong width
        raise CheckFailed(f"{wide} ({str(exc).splitlines()[0][:80]}): build the rotary tables with cfg.head_dim, "
                          "not hidden_size // num_heads") from None
    expect(_close(got, wide_ref(ids)), f"{wide}: build the rotary tables with cfg.head_dim, not hidden_size // num_heads")
    _peers(TPLlama, "7")
    return "the whole TP Llama: logits, loss and every gradient equal the single-process model"


@register("tp", "8", ("vocab_parallel_cross_entropy",), SCRIPT)
def _check_8(vocab_parallel_cross_entropy: Callable) -> str:
    logits = _x(2, 6, 10, seed=7)
    labels = torch.tensor([[0, 9, 4, 5, -100, 5], [3, 7, 1, 8, 2, 6]])
    got = vocab_parallel_cross_entropy(logits, labels, None)
    ref = F.cross_entropy(logits.reshape(-1, 10), labels.reshape(-1), ignore_index=-100)
    expect(isinstance(got, torch.Tensor) and got.ndim == 0 and abs(float(got) - float(ref)) < 1e-5,
            f"with one process it must equal F.cross_entropy ({float(ref):.5f}, ignoring -100), got {got}")
    big = logits * 5 + 100  # exp(100) overflows float32: only a shifted exp stays finite
    got = vocab_parallel_cross_entropy(big, labels, None)
    ref = F.cross_entropy(big.reshape(-1, 10), labels.reshape(-1), ignore_index=-100)
    expect(bool(torch.isfinite(got)) and abs(float(got) - float(ref)) < 1e-4,
           f"with logits near 100 the loss is {float(got)} instead of {float(ref):.5f}: exp overflows in float32 -- "
           "subtract the global max (all-reduced with MAX over the group) before exp")
    _peers(vocab_parallel_cross_entropy, "8")
    return "cross-entropy from the vocabulary slices, equal to F.cross_entropy, no gathered logits"


@register("tp", "9", ("tp_group_ranks", "make_tp_group"), SCRIPT)
def _check_9(tp_group_ranks: Callable, make_tp_group: Callable) -> str:
    expect(tp_group_ranks(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]], f"tp=2 of 8: contiguous pairs, got {tp_group_ranks(8, 2)}")
    expect(tp_group_ranks(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]], "tp=4 of 8: two contiguous blocks of 4")
    try:
        tp_group_ranks(6, 4)
    except ValueError:
        pass
    else:
        raise CheckFailed("tp=4 does not divide 6 processes: raise ValueError")
    _peers((make_tp_group, tp_group_ranks), "9")
    return "contiguous TP groups, every group created on every rank"


@register("tp", "10", ("dp_group_ranks", "make_dp_group"), SCRIPT)
def _check_10(dp_group_ranks: Callable, make_dp_group: Callable) -> str:
    expect(dp_group_ranks(8, 2, 4) == [[0, 2, 4, 6], [1, 3, 5, 7]], f"tp=2, dp=4: strided, got {dp_group_ranks(8, 2, 4)}")
    expect(dp_group_ranks(4, 4, 1) == [[0], [1], [2], [3]], "tp=4, dp=1: one group per rank")
    try:
        dp_group_ranks(4, 2, 3)
    except ValueError as exc:
        expect("world size" in str(exc), "say in the error that tp × dp must equal the world size")
    else:
        raise CheckFailed("tp=2 × dp=3 ≠ 4 processes: raise ValueError")
    _peers((make_dp_group, dp_group_ranks), "10")
    return "strided DP groups, tp × dp = world size enforced"


@register("tp", "11", ("dp_loader", "average_gradients", "reduce_over_dp"), SCRIPT)
def _check_11(dp_loader: Callable, average_gradients: Callable, reduce_over_dp: Callable) -> str:
    from torch.utils.data import DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(16))
    seen = []
    for dp_rank in (0, 1):
        loader, sampler = dp_loader(data, dp_rank, 2, 4, seed=0)
        expect(isinstance(sampler, DistributedSampler) and sampler.num_replicas == 2 and sampler.rank == dp_rank,
                "use a DistributedSampler with num_replicas=dp_size and rank=dp_rank (not the global rank)")
        expect(loader.batch_size == 4, "each DP replica loads batch_per_replica sequences")
        seen.append({int(i) for (b,) in loader for i in b})
    expect(not seen[0] & seen[1] and len(seen[0] | seen[1]) == 16, "the DP shards must be disjoint and cover the data")
    model = nn.Linear(3, 2)
    model(_x(4, 3)).sum().backward()
    before = model.weight.grad.clone()
    average_gradients(model, None)
    expect(torch.equal(model.weight.grad, before), "with one DP replica the gradients stay as they are")
    got = reduce_over_dp(torch.tensor(3.0), torch.tensor(4.0), None)
    expect(abs(float(got) - 0.75) < 1e-9, f"one process: loss_sum / count = 0.75, got {got}")
    _peers((average_gradients, reduce_over_dp, dp_loader), "11")
    return "data sharded by DP rank, gradients and metrics averaged over the DP group only"


@register("tp", "12", ("gather_from_sequence_region", "reduce_scatter_to_sequence_region"), SCRIPT)
def _check_12(gather_from_sequence_region: Callable, reduce_scatter_to_sequence_region: Callable) -> str:
    for name, fn in (("gather_from_sequence_region", gather_from_sequence_region),
                     ("reduce_scatter_to_sequence_region", reduce_scatter_to_sequence_region)):
        x = _x(2, 6, 5, seed=2).requires_grad_()
        y = fn(x, None)
        expect(isinstance(y, torch.Tensor) and torch.equal(y, x), f"{name}: with one process, the forward is the identity")
        (y * 3).sum().backward()
        expect(x.grad is not None and torch.equal(x.grad, torch.full_like(x, 3.0)),
               f"{name}: with one process, the backward passes the gradient through unchanged")
    _peers((gather_from_sequence_region, reduce_scatter_to_sequence_region), "12",
           "on 4 processes (TP groups of 2, then 4, then 3)")
    return ("sequence all-gather / reduce-scatter with conjugate backwards, one counted collective each, right chunks "
            "at tp 2 and 3; the SP Llama with them equals one process")
