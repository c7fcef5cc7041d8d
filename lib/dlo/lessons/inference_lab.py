"""The plumbing of ``Jour4/inference.ipynb``: its timings, each comparison timed interleaved so that the decision
rule (:func:`dlo.measure.decide.decide`, through :func:`dlo.measure.conclude`) can say whether a variant is faster
(:func:`latency`; one decoding step with and without the KV cache, :func:`decode_steps`; sparse layers,
:func:`sparse_layer_calls`; the 2:4 pattern on a GPU, :func:`semi_structured_calls`), which quantization API this
machine has (:func:`quantization_api`), and the plots built from them.
"""
from __future__ import annotations

import logging
import statistics
from typing import Any, Callable, Mapping

import torch
from torch import nn

from dlo.lessons.inference import cache_nbytes
from dlo.measure import Measurement, conclude, measure_interleaved

#: Interleaved rounds: at least 7 for the rank test to decide at 1 %, more when it is still unclear.
REPEATS, MAX_REPEATS = 8, 24


def latency(calls: Mapping[str, Callable[[], Any]], *, items: int, device: torch.device | str = "cpu",
            repeats: int = REPEATS, max_repeats: int | None = MAX_REPEATS, unit: str = "img/s",
            warmup: int | None = None) -> dict[str, Measurement]:
    """``{name: call}`` timed interleaved (``items`` processed per call): one Measurement each, by name."""
    kw = {} if warmup is None else {"warmup": warmup}
    return measure_interleaved(dict(calls), items_per_call=items, device=device, repeats=repeats,
                               max_repeats=max(max_repeats or repeats, repeats), unit=unit, track_memory=False,
                               progress=False, **kw)


def median_ms(m: Measurement) -> float:
    """Median milliseconds per call."""
    return 1e3 * statistics.median(m.times_s)


def conclude_all(results: dict[str, Any], pairs: list[tuple[Measurement, Measurement, str, str]]) -> list[str]:
    """One sentence per ``(a, b, a_label, b_label)``, each written by the decision rule and recorded."""
    return [conclude(results, a, b, a_label=la, b_label=lb) for a, b, la, lb in pairs]


@torch.inference_mode()
def decode_steps(model: nn.Module, context: int, *, vocab_size: int, device: torch.device | str = "cpu",
                 repeats: int = REPEATS, max_repeats: int | None = MAX_REPEATS,
                 seed: int = 0) -> tuple[dict[str, Measurement], int]:
    """One decoding step (one new token) after ``context`` tokens, without the cache (a forward over all
    ``context + 1`` tokens) and with it (a forward over the new token, the ``context`` previous keys and values
    cached by a prefill that is not timed), timed interleaved. After each cached step the cache is cropped back
    to ``context`` tokens, so every timed step sees the same cache. Returns ``({"no cache": ..., "KV cache":
    ...}, bytes of the cache)``."""
    device = torch.device(device)
    ids = torch.randint(0, vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(seed)).to(device)
    cache = model(input_ids=ids[:, :context], use_cache=True, logits_to_keep=1).past_key_values

    def uncached():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)

    def cached():
        model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-1)  # the new token out again: every timed step sees the same `context` tokens

    ms = latency({"no cache": uncached, "KV cache": cached}, items=1, device=device, repeats=repeats,
                 max_repeats=max_repeats, unit="tokens/s")
    return ms, cache_nbytes(cache)


def kv_sweep(model: nn.Module, contexts: list[int], *, vocab_size: int, device: torch.device | str = "cpu",
             repeats: int = REPEATS, max_repeats: int | None = MAX_REPEATS,
             progress: str | None = None) -> tuple[dict[int, dict[str, Measurement]], dict[int, int]]:
    """:func:`decode_steps` at every context length: ``({context: measurements}, {context: cache bytes})``."""
    from tqdm.auto import tqdm

    steps, sizes = {}, {}
    for L in tqdm(contexts, desc=progress, leave=False, disable=progress is None):
        steps[L], sizes[L] = decode_steps(model, L, vocab_size=vocab_size, device=device, repeats=repeats,
                                          max_repeats=max_repeats)
    return steps, sizes


def kv_table(steps: Mapping[int, Mapping[str, Measurement]], sizes: Mapping[int, int]):
    """Median ms per token with and without the cache, and the cache's MB, one row per context length."""
    import pandas as pd

    table = pd.DataFrame({"ms/token, no cache": {L: median_ms(m["no cache"]) for L, m in steps.items()},
                          "ms/token, KV cache": {L: median_ms(m["KV cache"]) for L, m in steps.items()},
                          "cache (MB)": {L: sizes[L] / 1e6 for L in steps}})
    table.index.name = "context"
    return table


def plot_kv(table, title: str, path=None):
    """Time per new token against the context (with and without the cache) and the cache's memory."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.4))
    axes[0].plot(table.index, table["ms/token, no cache"], marker="o", label="no cache: whole sequence each step")
    axes[0].plot(table.index, table["ms/token, KV cache"], marker="o", label="KV cache: the new token only")
    axes[0].set(xlabel="tokens already in the context", ylabel="ms per new token (median)", title=title)
    axes[0].legend(fontsize=8)
    axes[1].plot(table.index, table["cache (MB)"], marker="o", color="tab:red")
    axes[1].set(xlabel="tokens in the cache", ylabel="MB", title="memory held by the KV cache (measured)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def quantization_api() -> tuple[Any, str | None, str | None]:
    """``(torchao.quantization or None, "torchao" | "torch.ao" | None, why none)``: torchao where it is installed
    (its notes about optional GPU kernels this machine cannot load are silenced while it imports), else the
    deprecated ``torch.ao`` dynamic quantization where this torch build has an int8 CPU engine."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        from torchao import quantization as tq
    except ImportError:
        tq = None
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
    if tq is not None:
        return tq, "torchao", None
    engines = torch.backends.quantized.supported_engines
    if any(e in engines for e in ("x86", "fbgemm", "qnnpack")):
        return None, "torch.ao", None
    return None, None, f"no torchao, and this torch build has no int8 CPU engine (supported: {engines})"


def plot_distillation(curves: Mapping[str, list], teacher_accuracy: float, alpha: float, path=None):
    """Validation accuracy per epoch of every student configuration: each seed thin, their mean thick."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4))
    n_seeds = max(len(runs) for runs in curves.values())
    for (name, runs), color in zip(curves.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        epochs = [r["epoch"] for r in runs[0]]
        for c in runs:
            ax.plot(epochs, [r["test_accuracy"] for r in c], color=color, alpha=0.25, lw=1)
        ax.plot(epochs, [sum(c[i]["test_accuracy"] for c in runs) / len(runs) for i in range(len(epochs))],
                color=color, marker="o", label=f"student {name}")
    ax.axhline(teacher_accuracy, color="black", ls="--", label="teacher")
    ax.axhline(0.1, color="gray", ls=":", label="chance")
    ax.set(xlabel="epoch", ylabel="validation accuracy",
           title=f"Same student, same batches (thick: mean of {n_seeds} seeds, thin: each seed), alpha={alpha}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def sparse_layer_calls(d: int, device: torch.device | str = "cpu", batch: int = 64) -> dict[str, Callable[[], Any]]:
    """One ``d x d`` layer on a batch: the dense weight, the same with 90 % zeros in dense storage, and those
    zeros removed in CSR format (90 % and 99 %), as calls to time together (the CSR product checked first)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(d, d, generator=g).to(device)
    x = torch.randn(d, batch, generator=g).to(device)
    w90 = w * (torch.rand(d, d, generator=g) >= 0.9).to(device)
    w99 = w * (torch.rand(d, d, generator=g) >= 0.99).to(device)
    c90, c99 = w90.to_sparse_csr(), w99.to_sparse_csr()
    if not torch.allclose(torch.sparse.mm(c90, x), w90 @ x, atol=1e-3, rtol=1e-4):
        raise AssertionError("the CSR product differs from the dense one")
    return {f"{d}x{d}, dense": lambda: torch.mm(w, x),
            f"{d}x{d}, 90 % zeros (dense storage)": lambda: torch.mm(w90, x),
            f"{d}x{d}, 90 % zeros, CSR": lambda: torch.sparse.mm(c90, x),
            f"{d}x{d}, 99 % zeros, CSR": lambda: torch.sparse.mm(c99, x)}


def semi_structured_calls(d: int, device: torch.device | str, mask: Callable[[torch.Tensor], torch.Tensor]):
    """A ``d x d`` fp16 layer pruned to the 2:4 pattern (``mask``), dense and with its weight in the compressed
    2:4 format (``torch.sparse.to_sparse_semi_structured``, CUDA only): ``({"dense": call, "2:4": call}, largest
    difference between their outputs)``. Raises where the build or the GPU refuses the format."""
    from torch.sparse import to_sparse_semi_structured

    dense = nn.Linear(d, d).half().to(device).eval()
    xs = torch.randn(d, d, dtype=torch.half, device=device)
    with torch.no_grad():
        dense.weight.mul_(mask(dense.weight))
    sparse = nn.Linear(d, d).half().to(device).eval()
    sparse.load_state_dict(dense.state_dict())
    sparse.weight = nn.Parameter(to_sparse_semi_structured(sparse.weight), requires_grad=False)
    with torch.inference_mode():
        diff = (dense(xs) - sparse(xs)).abs().max().item()

    def run(layer):
        with torch.inference_mode():
            layer(xs)

    return {"dense": lambda: run(dense), "2:4": lambda: run(sparse)}, diff


__all__ = ["quantization_api", "plot_distillation", "sparse_layer_calls", "semi_structured_calls", "REPEATS", "MAX_REPEATS", "latency", "median_ms", "conclude_all", "decode_steps", "kv_sweep", "kv_table",
           "plot_kv"]
