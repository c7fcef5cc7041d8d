"""Loader settings compared the way every "faster" of the course is decided: interleaved repeats, then the
decision rule (:func:`dlo.measure.decide`), never one trial against another.

A single trial per setting (what :func:`dlo.lessons.loader.profile_loader` shows on a timeline) compares two
runs taken minutes apart: when the loop hardly ever waits for data, their difference is the training step's
own noise, not the loader's. Here every setting feeds the same training step for the same number of batches,
in turns (A B C, C B A, ...), from loaders whose workers stay up between turns, and the settings are then
compared with the decision rule; :func:`keep_sentence` keeps the cheapest setting that is not slower than the
fastest beyond the noise, and says plainly when the loop's wait was too small for any setting to matter.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from dlo.measure import bench
from dlo.measure.bench import Measurement
from dlo.measure.decide import decide


class _Feed:
    """``n_iters`` batches of a loader through ``compute``, resuming where the last call stopped (a new epoch
    when the loader runs out): the steady state of a training loop, turn after turn."""

    def __init__(self, loader, n_iters: int, compute: Callable[..., Any]) -> None:
        self.loader, self.n_iters, self.compute = loader, n_iters, compute
        self.iterator = None

    def __call__(self) -> None:
        for _ in range(self.n_iters):
            batch = next(self.iterator, None) if self.iterator is not None else None
            if batch is None:
                self.iterator = iter(self.loader)
                batch = next(self.iterator)
            self.compute(*batch)


def compare_settings(loaders: Mapping[str, Any], compute: Callable[..., Any], *, n_iters: int, items_per_call: int,
                     repeats: int = 5, max_repeats: int | None = None, warmup: bench.Warmup | int = bench.Warmup(),
                     device: Any = "cpu", progress: bool = True) -> dict[str, Measurement]:
    """``{label: Measurement}``: each loader feeding ``compute`` (moving the batch to the device is its job) for
    ``n_iters`` batches per timed call, the loaders timed interleaved. Give loaders with workers
    ``persistent_workers=True``: the turns then measure feeding, not starting processes."""
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 1:
        raise ValueError(f"n_iters must be a positive integer, got {n_iters!r}")
    if len(loaders) < 2:
        raise ValueError("compare_settings needs at least two loaders to compare")
    cands = [bench.Candidate(label, _Feed(ld, n_iters, compute), items_per_call * n_iters, device)
             for label, ld in loaders.items()]
    return bench.measure_interleaved(cands, repeats=repeats, max_repeats=max_repeats, warmup=warmup,
                                     track_memory=False, progress=progress)


def keep_sentence(ms: Mapping[str, Measurement], cost: Mapping[str, Sequence[float]], wait_fraction: float, *,
                  negligible_wait: float = 0.05) -> tuple[str, str]:
    """``(label kept, sentence)``. ``cost``: a sortable cost per label (workers, then prefetch...), cheapest
    first; ``wait_fraction``: the largest share of its time any trial's loop spent waiting for data.

    The fastest by median is the reference; every cheaper setting is decided against it; the cheapest one that
    is not slower beyond the noise is kept. When the loop waited at most ``negligible_wait`` of its time, the
    loader could not have made a difference: the sentence says so whatever the timings say."""
    labels = sorted(ms, key=lambda k: tuple(cost[k]))
    fastest = max(ms, key=lambda k: ms[k].throughput)
    verdicts = {k: ("reference" if k == fastest else decide(ms[k], ms[fastest]).outcome) for k in labels}
    kept = next(k for k in labels if verdicts[k] != "slower")
    rounds = min(len(m.times_s) for m in ms.values())
    detail = ", ".join(f"{k}: {verdicts[k]}" for k in labels if k != fastest)
    if wait_fraction <= negligible_wait:
        return labels[0], (f"No difference beyond the noise is to be expected here: the training loop waited for data "
                           f"at most {wait_fraction:.1%} of its time, so the step, not the loader, set the pace; keep "
                           f"the cheapest setting, {labels[0]} (timed interleaved, {rounds} rounds each; against the "
                           f"highest median, {fastest}: {detail or 'it is that one'}).")
    if kept == fastest:
        return kept, (f"Keep {kept}: the highest median of the interleaved rounds ({rounds} each), and every cheaper "
                      f"setting is slower beyond the noise ({detail or 'none is cheaper'}).")
    if verdicts[kept] == "same":
        return kept, (f"Keep {kept}: the cheapest setting, as fast as the highest median ({fastest}) within the noise "
                      f"over {rounds} interleaved rounds each ({detail}).")
    return kept, (f"Keep {kept}, the cheapest, by default: it could not be told apart from the highest median "
                  f"({fastest}) over {rounds} interleaved rounds each, nothing was shown slower beyond the noise "
                  f"({detail}).")


def epoch_starts_interleaved(loaders: Mapping[str, Any], n_epochs: int) -> dict[str, list[float]]:
    """Seconds from ``iter(loader)`` to the first batch, per epoch, for each loader, the loaders' epochs taken in
    turns (epoch 0 of each, then epoch 1 of each, ...), each epoch run to its end as in training."""
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or n_epochs < 2:
        raise ValueError(f"n_epochs must be an integer >= 2 (epoch 0 starts the workers in every case), "
                         f"got {n_epochs!r}")
    out: dict[str, list[float]] = {label: [] for label in loaders}
    for epoch in range(n_epochs):
        order = list(loaders) if epoch % 2 == 0 else list(reversed(list(loaders)))
        for label in order:
            t0 = time.perf_counter()
            iterator = iter(loaders[label])
            next(iterator)
            out[label].append(time.perf_counter() - t0)
            for _batch in iterator:
                pass
            del iterator
    return out
