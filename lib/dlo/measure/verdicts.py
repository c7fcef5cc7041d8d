"""Verdicts on measurements: is a difference beyond the noise, the sentences that state a measured outcome,
and the optimisation ladder that keeps a step only when it is faster beyond the noise.

The timing itself (warm-up until steady, interleaved repeats, median and spread) is :mod:`dlo.measure.bench`;
this module only reads its :class:`~dlo.measure.bench.Measurement` objects, or their records read back from a
results.json, and decides:

- :func:`faster_beyond_noise`: the rule every decision uses (median better *and* noise bands disjoint);
- :func:`unsteady_reason`: why no ratio may be given (warm-up not steady, or repeats spread too wide);
- :func:`compare_sentence` / :func:`break_even_sentence`: a sentence written from the numbers, hedged when
  the difference is within the noise; :func:`conclude` records it with the numbers behind it, and
  :func:`check_conclusions` writes every recorded sentence again from its numbers (a test runs it on each
  notebook's results.json, so prose cannot drift from the measurement);
- :class:`Ladder`: a sequence of optimisation steps, each kept or not by that rule.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Mapping

import torch
from dlo.measure.bench import (
    MAX_SPREAD, Candidate, Measurement, Timer, Warmup, format_number, measure_interleaved, quartiles,
)

# --------------------------------------------------------------------------------------------------
# Comparing measurements: beyond the noise or not, and the sentences that say so
# --------------------------------------------------------------------------------------------------

def format_ratio(ratio: float) -> str:
    """A ratio with 2 significant digits and an ``x``: 34.9 -> "35x", 3.64 -> "3.6x", 0.2 -> "0.20x",
    0.0123 -> "0.012x" (never "0x"). Near 1, where two digits would print "1.0x" for a ratio that is not 1
    within half a percent, three: 1.04 -> "1.04x" (so that "1.0x faster" is never printed for a real gain)."""
    r = float(ratio)
    if not math.isfinite(r) or r <= 0:
        return f"{r}x"
    text = _significant(r, 2)
    if text == "1.0" and abs(r - 1) >= 0.005:
        text = _significant(r, 3)
    return f"{text}x"


def _significant(r: float, n: int) -> str:
    digits = n - 1 - math.floor(math.log10(r))
    rounded = round(r, digits)
    if rounded >= 10 ** (n - digits):  # 9.96 rounds up to 10.0: one digit fewer after the point
        digits -= 1
        rounded = round(r, digits)
    return f"{rounded:.{max(digits, 0)}f}"


def _stats(x: Measurement | Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a comparison needs, from a Measurement or its record (e.g. read back from results.json)."""
    rec = x.to_record() if isinstance(x, Measurement) else x
    items = rec["items_per_call"]
    times = rec.get("times_s")
    if times:
        median = statistics.median(times)
        q25, q75 = quartiles(times)
    else:
        median, q25, q75 = rec["median_s"], rec.get("q25_s", rec["median_s"]), rec.get("q75_s", rec["median_s"])
    return {"name": rec.get("name") or rec.get("step") or "?", "unit": rec.get("unit", "img/s"), "items": items,
            "steady": rec.get("steady"), "throughput": items / median, "low": items / q75, "high": items / q25,
            "spread": (q75 - q25) / median if median > 0 else 0.0, "repeats": len(times) if times else None}


def unsteady_reason(x: Measurement | Mapping[str, Any], max_spread: float = MAX_SPREAD) -> str | None:
    """Why no ratio may be computed from ``x``, or None when it is steady: its warm-up did not reach steady
    timings, or its timed repeats spread more than ``max_spread`` (interquartile range / median)."""
    s = _stats(x)
    if s["steady"] is False:
        return f"the warm-up of {s['name']} did not reach steady timings"
    if s["spread"] > max_spread:
        return (f"the repeats of {s['name']} spread over {s['spread']:.0%} of their median (interquartile range), "
                f"more than {max_spread:.0%}: the machine was not steady")
    return None


def faster_beyond_noise(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any]) -> bool:
    """Whether ``a`` is faster than ``b`` beyond the noise: ``a``'s median throughput is higher *and* the
    two noise bands (interquartile ranges of the repeats) do not overlap, i.e. ``a`` at its slow quartile
    still beats ``b`` at its fast quartile."""
    sa, sb = _stats(a), _stats(b)
    return sa["throughput"] > sb["throughput"] and sa["low"] > sb["high"]


def compare_sentence(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any], *,
                     a_label: str | None = None, b_label: str | None = None) -> str:
    """One sentence comparing the throughputs of ``a`` and ``b`` (Measurements or their records), written
    from the numbers: "A is 3.6x faster than B on this machine (...)", "A is slower than B on this machine:
    0.50x its throughput (...)", "A against B: no measurable difference on this machine (within the
    noise ...)", or, when either is not steady (:func:`unsteady_reason`), why no ratio is given."""
    sa, sb = _stats(a), _stats(b)
    la, lb = a_label or sa["name"], b_label or sb["name"]
    reason = unsteady_reason(b) or unsteady_reason(a)
    if reason:
        return f"No ratio reported for {la} against {lb}: {reason}, so any ratio would be noise."
    numbers = f"{format_number(sa['throughput'])} vs {format_number(sb['throughput'])} {sa['unit']}, medians"
    ratio = format_ratio(sa["throughput"] / sb["throughput"])
    if faster_beyond_noise(a, b):
        return f"{la} is {ratio} faster than {lb} on this machine ({numbers}; the noise bands do not overlap)."
    if faster_beyond_noise(b, a):
        return (f"{la} is slower than {lb} on this machine: {ratio} its throughput ({numbers}; "
                f"the noise bands do not overlap).")
    return f"{la} against {lb}: no measurable difference on this machine (within the noise: {numbers})."


def break_even_sentence(compiled: Measurement | Mapping[str, Any], eager: Measurement | Mapping[str, Any],
                        compile_seconds: float) -> str:
    """Whether a compilation that cost ``compile_seconds`` pays off, from the measured steps: after how
    many steps the time saved per step adds up to it, or that it does not pay off here (not faster beyond
    the noise), or why no figure is given (not steady)."""
    sc, se = _stats(compiled), _stats(eager)
    reason = unsteady_reason(eager) or unsteady_reason(compiled)
    if reason:
        return f"No break-even reported for {sc['name']}: {reason}."
    if faster_beyond_noise(compiled, eager):
        # a compiled step of N items saves N x (eager - compiled) seconds per item
        saved_per_step = sc["items"] * (1 / se["throughput"] - 1 / sc["throughput"])
        return (f"{sc['name']} is {format_ratio(sc['throughput'] / se['throughput'])} faster than {se['name']}: "
                f"its first call ({compile_seconds:.1f} s, compilation included) is paid back after about "
                f"{math.ceil(compile_seconds / saved_per_step):,} steps.")
    return (f"{sc['name']} is not faster than {se['name']} beyond the noise on this machine "
            f"({format_number(sc['throughput'])} vs {format_number(se['throughput'])} {sc['unit']}, medians): the "
            f"{compile_seconds:.1f} s compilation does not pay off here.")


#: The helpers that write conclusions, by the ``kind`` :func:`conclude` records.
CONCLUSION_HELPERS: dict[str, Callable[..., str]] = {"compare": compare_sentence, "break_even": break_even_sentence}


def _plain(x: Measurement | Mapping[str, Any]) -> dict[str, Any]:
    return x.to_record() if isinstance(x, Measurement) else dict(x)


def conclude(results: dict[str, Any], a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any], *,
             kind: str = "compare", **args: Any) -> str:
    """Write the sentence of helper ``kind`` (:data:`CONCLUSION_HELPERS`) for ``a`` and ``b``, append it with
    both records and ``args`` to ``results["conclusions"]`` (so results.json holds the numbers behind every
    sentence), and return it, e.g. for ``display(Markdown(...))``."""
    if kind not in CONCLUSION_HELPERS:
        raise ValueError(f"unknown conclusion kind {kind!r}: use one of {', '.join(CONCLUSION_HELPERS)}")
    sentence = CONCLUSION_HELPERS[kind](a, b, **args)
    results.setdefault("conclusions", []).append(
        {"kind": kind, "a": _plain(a), "b": _plain(b), "args": dict(args), "sentence": sentence})
    return sentence


def check_conclusions(results: Mapping[str, Any]) -> list[str]:
    """Every recorded conclusion written again from its recorded numbers: one line per sentence that the
    numbers do not give (an empty list: every stated outcome is what was measured)."""
    problems = []
    for i, c in enumerate(results.get("conclusions", [])):
        helper = CONCLUSION_HELPERS.get(c.get("kind"))
        if helper is None:
            problems.append(f"conclusion {i}: unknown kind {c.get('kind')!r}")
            continue
        expected = helper(c["a"], c["b"], **c.get("args", {}))
        if expected != c.get("sentence"):
            problems.append(f"conclusion {i} says {c.get('sentence')!r} but its numbers give {expected!r}")
    return problems


# --------------------------------------------------------------------------------------------------
# The optimisation ladder
# --------------------------------------------------------------------------------------------------

class Ladder:
    """An optimisation ladder: each step is measured against the fastest configuration so far and *kept*
    only if it beats it on this machine (a change that helps on a GPU can hurt on a CPU).

    **Keep rule.** A step is kept only when it is faster than the best so far *beyond the noise*: its
    median throughput is higher and the two noise bands, the interquartile ranges [q25, q75] of the
    repeats, do not overlap; and both measurements are steady (:func:`unsteady_reason`). With
    :meth:`try_step` both are timed interleaved (A B A B ...) in the same run; the table's ``decision``
    column says "kept", "not faster beyond noise", "slower", "not steady: not kept" or "not applicable".

    ``current`` is the configuration the next step builds on. :meth:`try_step` measures a step (given as a
    call) against the best so far and records it; :meth:`record` adds a row from a Measurement already
    taken (compared with the best row as it was measured then), or ``None`` with a reason when the step
    does not apply here. :meth:`final_comparison` times the baseline and the final configuration again,
    interleaved, for the headline; :meth:`summary` refuses a speed-up whose measurements are not steady.
    """

    def __init__(self, **initial_config: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] = dict(initial_config)
        self.final: dict[str, Measurement] | None = None
        self._calls: dict[str, Candidate] = {}

    def best(self) -> dict[str, Any] | None:
        """The last kept row: each kept step beat the best before it."""
        kept = [r for r in self.rows if r["kept"]]
        return kept[-1] if kept else None

    def baseline(self) -> dict[str, Any] | None:
        measured = [r for r in self.rows if r["applicable"]]
        return measured[0] if measured else None

    def try_step(self, step: str, call: Callable[[], Any], *, items_per_call: int, device: torch.device | str = "cpu",
                 config: Mapping[str, Any] | None = None, repeats: int = 5, warmup: Warmup | int = Warmup(),
                 unit: str = "img/s", track_memory: bool = True, progress: bool = True, timer: Timer | None = None,
                 **extra: Any) -> dict[str, Any]:
        """Measure ``call`` (one step of the configuration ``config``) interleaved with the best
        configuration so far, then record it (see the keep rule). The first step is the baseline."""
        if step in self._calls or any(r["step"] == step for r in self.rows):
            raise ValueError(f"step {step!r} is already in the ladder: give each step its own name")
        cand = Candidate(step, call, items_per_call, str(device), dict(extra))
        best = self.best()
        opts = dict(repeats=repeats, warmup=warmup, unit=unit, track_memory=track_memory, progress=progress,
                    timer=timer)
        if best is None:
            ms = measure_interleaved([cand], **opts)
            row = self.record(step, ms[step], **dict(config or {}))
        else:
            if best["step"] not in self._calls:
                raise ValueError(f"the best step so far, {best['step']!r}, was recorded without its call: "
                                 f"measure it with try_step to compare with it")
            ms = measure_interleaved([self._calls[best["step"]], cand], **opts)
            row = self.record(step, ms[step], reference=ms[best["step"]], **dict(config or {}))
        if row["kept"]:
            self._calls[step] = cand
        return row

    def record(self, step: str, measurement: Measurement | None = None, reason: str | None = None, *,
               reference: Measurement | None = None, **config: Any) -> dict[str, Any]:
        """Add a row. ``reference``: the best configuration timed together with ``measurement`` (by
        :meth:`try_step`); without it the comparison uses the best row as it was measured earlier."""
        row: dict[str, Any] = {"step": step, "applicable": measurement is not None, "reason": reason,
                               "kept": False, "decision": "not applicable", **config}
        if measurement is None:
            if not reason:
                raise ValueError(f"step {step!r}: give a measurement, or the reason it does not apply here")
            print(f"{step}: not applicable here -- {reason}")
            self.rows.append(row)
            return row
        row.update(measurement.to_record())
        best = self.best()
        if best is None:
            row.update(kept=True, decision="baseline")
            note = unsteady_reason(measurement)
            if note:
                row["note"] = note
        else:
            ref = reference.to_record() if reference is not None else {k: v for k, v in best.items() if k != "reference"}
            ref["name"] = ref.get("name") or best["step"]
            row["reference"] = ref
            row["best_step"] = best["step"]
            row["conclusion"] = compare_sentence(measurement, ref)
            note = unsteady_reason(ref) or unsteady_reason(measurement)
            # no ratio from a measurement that is not steady: vs_best stays None
            row["vs_best"] = None if note else _stats(measurement)["throughput"] / _stats(ref)["throughput"]
            if note:
                row.update(decision="not steady: not kept", note=note)
            elif faster_beyond_noise(measurement, ref):
                row.update(kept=True, decision="kept")
            elif faster_beyond_noise(ref, measurement):
                row["decision"] = "slower"
            else:
                row["decision"] = "not faster beyond noise"
        if row["kept"]:
            self.current.update(config)
        print(measurement, f"-> {row['decision']}")
        self.rows.append(row)
        return row

    def final_comparison(self, *, repeats: int = 5, warmup: Warmup | int = Warmup(), unit: str = "img/s",
                         track_memory: bool = False, progress: bool = True,
                         timer: Timer | None = None) -> dict[str, Measurement] | None:
        """Time the baseline and the final configuration again, interleaved, for the headline speed-up
        (numbers taken at the same time, not at both ends of the run). Returns ``{"final": ..., "baseline":
        ...}`` (also kept in ``self.final`` for :meth:`summary`), or None when no step beat the baseline."""
        base, best = self.baseline(), self.best()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        if best is base:
            self.final = None
            return None
        missing = [s for s in (base["step"], best["step"]) if s not in self._calls]
        if missing:
            raise ValueError(f"step(s) {missing} were recorded without their call: measure them with try_step")
        ms = measure_interleaved([self._calls[base["step"]], self._calls[best["step"]]], repeats=repeats,
                                 warmup=warmup, unit=unit, track_memory=track_memory, progress=progress, timer=timer)
        self.final = {"final": ms[best["step"]], "baseline": ms[base["step"]]}
        return self.final

    def table(self):
        """All rows, with the speed-up over the baseline (``speedup``, NaN when the baseline is not steady)
        and the ratios as text, 2 significant digits (``speedup_text``, ``vs_best_text``)."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        base = self.baseline()
        if base is None or "throughput" not in df:
            return df
        refused = unsteady_reason(base)
        df["speedup"] = float("nan") if refused else df["throughput"] / base["throughput"]
        df["speedup_text"] = [("" if not r["applicable"] else "no ratio: baseline not steady" if refused
                               else format_ratio(r["throughput"] / base["throughput"])) for r in self.rows]
        df["vs_best_text"] = [format_ratio(r["vs_best"]) if r.get("vs_best") is not None
                              else "no ratio: not steady" if r.get("note") and r["decision"] != "baseline" else ""
                              for r in self.rows]
        return df

    def summary(self) -> dict[str, Any]:
        """The configuration the ladder ends with and its speed-up over the baseline: from
        :meth:`final_comparison` when it was run, else from the rows. ``final_speedup`` is None when either
        measurement is not steady (``final_sentence`` says why)."""
        base, best = self.baseline(), self.best()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        out: dict[str, Any] = {"final_config": dict(self.current), "final_step": best["step"],
                               "steps_not_kept": [r["step"] for r in self.rows if r["applicable"] and not r["kept"]],
                               "baseline_steady": unsteady_reason(base) is None}
        if best is base:
            out.update(final_speedup=1.0, final_sentence=(f"No step beat the baseline ({base['step']}) beyond the "
                                                          f"noise on this machine: the final configuration is the baseline."))
            return out
        a, b = (self.final["final"], self.final["baseline"]) if self.final else (best, base)
        refused = unsteady_reason(b) or unsteady_reason(a)
        out["final_speedup"] = None if refused else _stats(a)["throughput"] / _stats(b)["throughput"]
        out["final_sentence"] = compare_sentence(a, b, a_label=f"the final configuration ({best['step']})",
                                                 b_label=f"the baseline ({base['step']})")
        return out
