"""Sentences of the Jour 3 notebooks that state an outcome, written from the run's numbers.

Each function takes what the run measured or counted and returns the sentence the notebook shows, so that a
sentence can never say more than its numbers: the accumulation's memory (counted bytes, and the measured peak
only where its difference exceeds the noise of repeated readings), the steps taken by a growing batch, a time
column read as a verdict only where the decision rule gives one. ``tests/test_prose_claims.py`` runs them on
fabricated numbers, and on the notebooks' results.json when a run left one.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch


def saved_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for the backward while ``fn()`` runs (each storage once): the
    activations a forward keeps alive until its backward. A count, not a reading: the same call gives the
    same number every time, on any device."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def accumulation_sentence(rows: Sequence[Mapping[str, Any]]) -> str:
    """What gradient accumulation bought in this run. ``rows``: one per ``accum_steps`` with ``saved_MiB`` (the
    activations of one micro-batch, counted), ``peak_MiB`` (list of the peak memory readings of repeated
    measurements) and ``memory_kind``. The counted difference is stated as it is; the measured peak only when
    the two configurations' readings are apart by more than each one's own spread."""
    by_k = sorted(rows, key=lambda r: r["accum_steps"])
    one, many = by_k[0], by_k[-1]
    if one["accum_steps"] == many["accum_steps"]:
        raise ValueError("accumulation_sentence needs two different accum_steps")
    k = many["accum_steps"]
    s1, sk = one["saved_MiB"], many["saved_MiB"]
    if sk < s1:
        out = (f"Counted: one micro-batch at accum_steps={k} keeps {sk:.3g} MiB of tensors for its backward, the "
               f"whole batch at accum_steps={one['accum_steps']} {s1:.3g} MiB ({s1 / sk:.2g}x more): that is what "
               f"accumulation saves.")
    else:
        out = (f"Counted: one micro-batch at accum_steps={k} keeps {sk:.3g} MiB of tensors for its backward, "
               f"no less than the whole batch at accum_steps={one['accum_steps']} ({s1:.3g} MiB): accumulation saved "
               f"nothing here.")
    p1, pk = one["peak_MiB"], many["peak_MiB"]
    kind = one.get("memory_kind", "peak")
    readings = f"{min(pk):.0f}-{max(pk):.0f} MiB against {min(p1):.0f}-{max(p1):.0f} MiB over the repeats"
    if max(pk) < min(p1) or max(p1) < min(pk):
        agrees = (max(pk) < min(p1)) == (sk < s1)
        return out + (f" The measured peak ({kind}) {'agrees' if agrees else 'goes the other way'}, beyond the noise "
                      f"of its repeats: {readings}.")
    return out + (f" The measured peak ({kind}: {readings}) does not tell them apart: the readings overlap, and the "
                  f"process holds much more than these activations.")


def steps_sentence(steps: Mapping[str, int], reference: str) -> str:
    """Which runs took fewer optimiser steps than ``reference``, from the counted steps (``{run: steps}``)."""
    ref = steps[reference]
    fewer = [f"{name} ({n})" for name, n in steps.items() if name != reference and n < ref]
    more = [f"{name} ({n})" for name, n in steps.items() if name != reference and n > ref]
    same = [f"{name}" for name, n in steps.items() if name != reference and n == ref]
    parts = []
    if fewer:
        parts.append("fewer steps than " + f"{reference} ({ref}): " + ", ".join(fewer))
    if more:
        parts.append("more steps than " + f"{reference} ({ref}): " + ", ".join(more))
    if same:
        parts.append("as many steps as " + f"{reference} ({ref}): " + ", ".join(same))
    return "Counted optimiser steps -- " + "; ".join(parts) + "."


def ema_window_sentence(run: str, steps: int, reference: str, reference_steps: int, decay: float) -> str:
    """How the EMA's memory (about ``1 / (1 - decay)`` steps) compares with the counted steps of ``run`` and of
    ``reference``: whether the run took fewer, more or as many steps, from the counts, never from the recipe."""
    window = 1 / (1 - decay)
    if steps < reference_steps:
        how = f"fewer steps than {reference} ({reference_steps})"
    elif steps > reference_steps:
        how = f"more steps than {reference} ({reference_steps})"
    else:
        how = f"as many steps as {reference}"
    share = f"{window / steps:.0%} of its steps" if steps else "more than its steps"
    return (f"Counted: {run} took {steps} optimiser steps, {how}; an EMA of decay {decay:g} remembers about "
            f"{window:.0f} steps, {share}.")
