"""Epoch times read as a measurement, so that a sentence comparing the speed of two trainings is written from
the numbers (``dlo.measure.compare_sentence`` / ``conclude``) instead of being typed in a notebook.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from dlo.measure.bench import Measurement
from dlo.runtime.validate import is_int


def epoch_measurement(name: str, records: Iterable[Mapping[str, Any]], items_per_epoch: int, *, skip: int = 1,
                      unit: str = "img/s") -> Measurement:
    """The epochs of a training run (the ``"epoch"`` records of :func:`dlo.training.loop.train`, their
    ``seconds``) as a :class:`~dlo.measure.bench.Measurement`: one call = one epoch of ``items_per_epoch`` images.

    The first ``skip`` epochs pay one-off costs (DataLoader workers starting, the allocator, the first kernels):
    they are kept as warm-up times, not timed. With fewer than two timed epochs there is no spread to judge a
    difference by, so the measurement says it is not steady and no ratio will be written from it. The epochs of
    two runs are timed one run after the other, not interleaved: a drift of the machine between the runs is
    blamed on one of them, which is why the sentences say "on this machine" and why close numbers read as
    "no measurable difference".
    """
    if not is_int(items_per_epoch) or items_per_epoch < 1:
        raise ValueError(f"items_per_epoch must be a positive integer (images per epoch), got {items_per_epoch!r}")
    if not is_int(skip) or skip < 0:
        raise ValueError(f"skip must be an integer >= 0 (epochs left out as warm-up), got {skip!r}")
    seconds = [float(r["seconds"]) for r in records if r.get("event", "epoch") == "epoch"]
    if len(seconds) <= skip:
        raise ValueError(f"{name}: {len(seconds)} epoch(s) recorded, {skip} skipped as warm-up: nothing left to time; "
                         f"train more epochs or skip fewer")
    timed = seconds[skip:]
    return Measurement(name=name, times_s=timed, items_per_call=int(items_per_epoch), unit=unit, warmup=skip,
                       warmup_times_s=seconds[:skip], steady=None if len(timed) >= 2 else False,
                       extra={"what": "epoch time", "epochs_timed": len(timed)})
