"""Verdicts on measurements: is a difference beyond the noise, the sentences that state a measured outcome,
and the optimisation ladder that keeps a step only when it is faster beyond the noise.

The timing itself (warm-up until steady, interleaved repeats, median and spread) is :mod:`dlo.measure.bench`;
this module only reads its :class:`~dlo.measure.bench.Measurement` objects, or their records read back from a
results.json, and decides:

- :func:`faster_beyond_noise`: the rule every decision uses (median better *and* noise bands disjoint);
- :func:`unsteady_reason`: why no ratio may be given (warm-up not steady, or repeats spread too wide);
- :func:`compare_sentence` / :func:`break_even_sentence` / :func:`retry_sentence`: a sentence written from the
  numbers, hedged when the difference is within the noise; :func:`conclude` records it with the numbers behind it, and
  :func:`check_conclusions` writes every recorded sentence again from its numbers (a test runs it on each
  notebook's results.json, so prose cannot drift from the measurement);
- :class:`Ladder`: a sequence of optimisation steps, each kept or not by that rule, the steps left out tried
  again at the batch the sweep chose, and the headline against the fp32 baseline of the same device.
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


def _outcome(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any]) -> tuple[str, str, str]:
    """How ``a`` did against ``b``: ``(kind, verdict, numbers)``, kind one of "faster", "slower", "same",
    "unsteady"; the verdict follows "was" or "is" in a sentence, the numbers go in brackets after it."""
    sa, sb = _stats(a), _stats(b)
    reason = unsteady_reason(b) or unsteady_reason(a)
    if reason:
        return "unsteady", "not measured steadily", f"{reason}, so no ratio is given"
    numbers = f"{format_number(sa['throughput'])} vs {format_number(sb['throughput'])} {sa['unit']}, medians"
    ratio = format_ratio(sa["throughput"] / sb["throughput"])
    if faster_beyond_noise(a, b):
        return "faster", f"{ratio} faster", f"{numbers}; the noise bands do not overlap"
    if faster_beyond_noise(b, a):
        return "slower", "slower", f"{ratio} the throughput: {numbers}; the noise bands do not overlap"
    return "same", "not faster beyond the noise", numbers


def retry_sentence(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any], *,
                   first: Mapping[str, Any], first_reference: Mapping[str, Any], label: str,
                   first_batch: int | None, batch: int, reference_batch: int | None = None) -> str:
    """A step tried at ``first_batch`` (``first`` against ``first_reference``, timed together) and tried again
    at ``batch`` (``a`` against ``b``, the best configuration so far, which ran at ``reference_batch``): one
    sentence with both outcomes, written from the numbers, e.g. "bf16 autocast was not faster beyond the noise
    at batch 256 (16,477 vs 15,715 img/s, medians), but 1.8x faster at batch 8192 (66,146 vs 36,013 img/s,
    medians; the noise bands do not overlap)." """
    k1, v1, n1 = _outcome(first, first_reference)
    k2, v2, n2 = _outcome(a, b)
    if reference_batch is not None and reference_batch != batch and k2 != "unsteady":
        n2 += f"; the best configuration so far, timed with it, ran at batch {reference_batch}"
    link = "but" if k2 == "faster" and k1 != "faster" else "and still" if k1 == k2 else "and"
    return f"{label} was {v1} at batch {first_batch} ({n1}), {link} {v2} at batch {batch} ({n2})."


#: The helpers that write conclusions, by the ``kind`` :func:`conclude` records.
CONCLUSION_HELPERS: dict[str, Callable[..., str]] = {"compare": compare_sentence, "break_even": break_even_sentence,
                                                     "retry": retry_sentence}


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

#: How a step's first decision reads in the "why" of its retry ("re-tried at batch 8192: not faster beyond the
#: noise at batch 256").
_FIRST_DECISION = {"not faster beyond noise": "not faster beyond the noise", "slower": "slower",
                   "not steady: not kept": "not steady", "kept": "kept, then left out by a later step"}


class Ladder:
    """An optimisation ladder: each step is measured against the fastest configuration so far and *kept*
    only if it beats it on this machine (a change that helps on a GPU can hurt on a CPU).

    **Keep rule.** A step is kept only when it is faster than the best so far *beyond the noise*: its
    median throughput is higher and the two noise bands, the interquartile ranges [q25, q75] of the
    repeats, do not overlap; and both measurements are steady (:func:`unsteady_reason`). With
    :meth:`try_step` both are timed interleaved (A B A B ...) in the same run; the table's ``decision``
    column says "kept", "not faster beyond noise", "slower", "not steady: not kept" or "not applicable".

    **Re-trying at the chosen batch.** Whether a step pays depends on the batch: on a large GPU a small batch
    leaves the step launch-bound (the GPU waits for the CPU to issue kernels), and then neither bf16 nor
    compilation can speed it up; at a batch that fills the GPU they can. Once the ladder has kept a larger
    batch, :meth:`retry` tries every step that is not in the configuration again at that batch, each against
    the best configuration so far at that batch, with the same keep rule.

    **Headline.** The final configuration is compared with the fp32 baseline *on its own device*
    (:meth:`device_baseline`: the first measured step on that device, e.g. "GPU fp32" on a GPU, the CPU
    baseline on a CPU-only machine), never with another device; :meth:`final_comparison` times the two again,
    interleaved, and :meth:`summary` refuses a speed-up whose measurements are not steady.

    ``current`` is the configuration the next step builds on (give ``batch_size`` in it, so that each row
    knows its batch). :meth:`try_step` measures a step (given as a call) against the best so far and records
    it; :meth:`record` adds a row from a Measurement already taken (compared with the best row as it was
    measured then), or ``None`` with a reason when the step does not apply here. Each row keeps ``change``,
    the part of its configuration that differs from the configuration it was tried on.
    """

    #: Configuration keys whose change is not a step to re-try at another batch (the batch itself, the device).
    NOT_RETRIED = ("batch_size", "device")

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
        """The ladder's first measured step (e.g. "CPU fp32")."""
        measured = [r for r in self.rows if r["applicable"]]
        return measured[0] if measured else None

    def device_baseline(self) -> dict[str, Any] | None:
        """The first measured step on the device of the best configuration: the fp32 baseline every speed-up
        of the final configuration is measured against (on a GPU the "GPU fp32" step, not the CPU one; on a
        CPU-only machine the CPU baseline)."""
        best = self.best()
        if best is None:
            return self.baseline()
        same = [r for r in self.rows if r["applicable"] and r.get("device") == best.get("device")]
        return same[0] if same else self.baseline()

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
        self._calls[step] = cand  # kept or not: the final comparison may need the baseline of its device
        return row

    def record(self, step: str, measurement: Measurement | None = None, reason: str | None = None, *,
               reference: Measurement | None = None, **config: Any) -> dict[str, Any]:
        """Add a row. ``reference``: the best configuration timed together with ``measurement`` (by
        :meth:`try_step`); without it the comparison uses the best row as it was measured earlier."""
        change = {k: v for k, v in config.items() if k not in self.current or self.current[k] != v}
        row: dict[str, Any] = {"step": step, "applicable": measurement is not None, "reason": reason,
                               "kept": False, "decision": "not applicable", **config, "change": change}
        row.setdefault("batch_size", self.current.get("batch_size"))
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

    # ----------------------------------------------------------------------------------------------
    # Re-trying the steps left out, at the chosen batch
    # ----------------------------------------------------------------------------------------------

    def dropped(self) -> list[dict[str, Any]]:
        """The measured steps whose change is not in the current configuration: not kept (slower, within the
        noise, not steady), or kept and then undone by a later step. Not the baseline, not the changes of
        batch or device (:data:`NOT_RETRIED`), not the retries themselves."""
        out = []
        for r in self.rows:
            change = r.get("change") or {}
            if not r["applicable"] or r.get("retry_of") or not change or r is self.baseline():
                continue
            if any(k in change for k in self.NOT_RETRIED):
                continue
            if any(self.current.get(k) != v for k, v in change.items()):
                out.append(r)
        return out

    def retry(self, make_call: Callable[[dict[str, Any], int], Callable[[], Any]], batch: int | None = None, *,
              skip: Mapping[str, str] | None = None, items_per_call: int | None = None,
              device: torch.device | str = "cpu", repeats: int = 5, warmup: Warmup | int = Warmup(),
              unit: str = "img/s", track_memory: bool = True, progress: bool = True, timer: Timer | None = None,
              errors: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)) -> list[dict[str, Any]]:
        """Try every :meth:`dropped` step again at ``batch`` (default: the batch of the current configuration,
        i.e. the one the batch sweep kept), in ladder order, each on top of the best configuration so far.

        ``make_call(config, batch)`` builds one training step of ``config`` at ``batch`` (a fresh model, a
        batch of that size) and returns a call without arguments. Each retry is timed interleaved with the best
        configuration so far (its own call: at ``batch`` once the ladder kept that batch, else at the batch it
        was kept at; throughputs per image compare across batches) and kept only beyond the noise, as any step;
        a kept retry is the best configuration for the next one. Returns the new rows: ``step`` "retry: <step> at batch <batch>", ``retry_of``,
        ``first_batch``, ``retry_why`` ("re-tried at batch 8192: not faster beyond the noise at batch 256") and
        ``conclusion`` (:func:`retry_sentence`, both outcomes). Steps named in ``skip`` get a row saying why
        they were not re-tried; a retry that raises one of ``errors`` (out of memory) gets a "failed" row.
        Steps already tried at ``batch`` are not tried again."""
        batch = batch if batch is not None else self.current.get("batch_size")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"retry needs the batch to re-try at (a positive integer), got {batch!r}: give "
                             "batch=, or batch_size in the ladder's configuration")
        skip = dict(skip or {})
        items = items_per_call if items_per_call is not None else batch
        opts = dict(repeats=repeats, warmup=warmup, unit=unit, track_memory=track_memory, progress=progress,
                    timer=timer)
        new_rows = []
        done = {r["retry_of"] for r in self.rows if r.get("retry_of") and r.get("batch_size") == batch}
        for first in self.dropped():
            first_batch = first.get("batch_size")
            if first_batch == batch or first["step"] in done:
                continue
            name = f"retry: {first['step']} at batch {batch}"
            why = (f"re-tried at batch {batch}: {_FIRST_DECISION.get(first['decision'], first['decision'])} "
                   f"at batch {first_batch}")
            info = {"retry_of": first["step"], "first_batch": first_batch, "retry_why": why}
            if first["step"] in skip:
                row = {"step": name, "applicable": False, "kept": False, "decision": "not re-tried",
                       "reason": f"not re-tried at batch {batch}: {skip[first['step']]}", "batch_size": batch, **info}
                print(f"{name}: {row['reason']}")
                self.rows.append(row)
                new_rows.append(row)
                continue
            best = self.best()
            if best is None or best["step"] not in self._calls:
                raise ValueError("the best step so far was recorded without its call: measure it with try_step")
            reference = self._calls[best["step"]]
            config = {**self.current, **first["change"], "batch_size": batch}
            cand = Candidate(name, make_call(config, batch), items, str(device))
            try:
                ms = measure_interleaved([reference, cand], **opts)
            except errors as exc:
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                row = {"step": name, "applicable": False, "kept": False, "decision": "failed",
                       "reason": f"{why}; it failed: {type(exc).__name__}: {text}"[:300], "batch_size": batch, **info}
                print(f"{name}: {row['reason']}")
                self.rows.append(row)
                new_rows.append(row)
                continue
            row = self.record(name, ms[name], reference=ms[reference.name], **config)
            row.update(info, reference_batch=best.get("batch_size"))
            row["conclusion"] = retry_sentence(ms[name], ms[reference.name], first=first,
                                               first_reference=first.get("reference") or first,
                                               label=first["step"], first_batch=first_batch, batch=batch,
                                               reference_batch=best.get("batch_size"))
            self._calls[name] = cand
            new_rows.append(row)
        if not new_rows:
            print(f"nothing to re-try at batch {batch}: every step is in the configuration or was tried at that batch")
        return new_rows

    # ----------------------------------------------------------------------------------------------
    # The headline
    # ----------------------------------------------------------------------------------------------

    def final_comparison(self, *, repeats: int = 5, warmup: Warmup | int = Warmup(), unit: str = "img/s",
                         track_memory: bool = False, progress: bool = True, timer: Timer | None = None,
                         context: bool = True) -> dict[str, Measurement] | None:
        """Time the fp32 baseline of the final configuration's device (:meth:`device_baseline`) and the final
        configuration again, interleaved, for the headline speed-up (numbers taken at the same time, not at both
        ends of the run). With ``context``, the ladder's first step when it ran on another device (the CPU
        baseline of a GPU ladder) is timed with them, for a comparison given as context only. Returns
        ``{"final": ..., "baseline": ...[, "start": ...]}`` (also kept in ``self.final`` for :meth:`summary`),
        or None when the final configuration is that baseline."""
        base, best, start = self.device_baseline(), self.best(), self.baseline()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        if best is base:
            self.final = None
            return None
        steps = [base["step"], best["step"]]
        if context and start is not base and start["step"] in self._calls:
            steps.append(start["step"])
        missing = [s for s in steps[:2] if s not in self._calls]
        if missing:
            raise ValueError(f"step(s) {missing} were recorded without their call: measure them with try_step")
        ms = measure_interleaved([self._calls[s] for s in steps], repeats=repeats, warmup=warmup, unit=unit,
                                 track_memory=track_memory, progress=progress, timer=timer)
        self.final = {"final": ms[best["step"]], "baseline": ms[base["step"]]}
        if len(steps) == 3:
            self.final["start"] = ms[start["step"]]
        return self.final

    def labels(self) -> dict[str, str]:
        """How the headline names the final configuration and its baseline: step and batch."""
        base, best = self.device_baseline(), self.best()

        def name(r: Mapping[str, Any]) -> str:
            return f"{r['step']}, batch {r['batch_size']}" if r.get("batch_size") else r["step"]

        return {"final": f"the final configuration ({name(best)})", "baseline": f"the fp32 baseline on this device "
                f"({name(base)})", "start": f"the ladder's first step ({name(self.baseline())})"}

    def table(self):
        """All rows, with the speed-up over the fp32 baseline of the final configuration's device
        (:meth:`device_baseline`; ``speedup``, NaN when that baseline is not steady), the ratios as text,
        2 significant digits (``speedup_text``, ``vs_best_text``), and ``why``: why a step does not apply, why it
        was re-tried, why no ratio is given."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        base = self.device_baseline()
        if base is None or "throughput" not in df:
            return df
        refused = unsteady_reason(base)
        df["speedup"] = float("nan") if refused else df["throughput"] / base["throughput"]
        df["speedup_text"] = [("" if not r["applicable"] else "no ratio: baseline not steady" if refused
                               else format_ratio(r["throughput"] / base["throughput"])) for r in self.rows]
        df["vs_best_text"] = [format_ratio(r["vs_best"]) if r.get("vs_best") is not None
                              else "no ratio: not steady" if r.get("note") and r["decision"] != "baseline" else ""
                              for r in self.rows]
        df["why"] = ["; ".join(str(r[k]) for k in ("reason", "retry_why", "note")
                               if r.get(k) and not (k == "retry_why" and r.get("reason"))) for r in self.rows]
        df["baseline_step"] = base["step"]
        return df

    def summary(self) -> dict[str, Any]:
        """The configuration the ladder ends with (``final_config``, ``final_step``, ``final_batch_size``) and
        its speed-up over the fp32 baseline of its own device (``final_speedup``, ``baseline_step``): from
        :meth:`final_comparison` when it was run, else from the rows. ``final_speedup`` is None when either
        measurement is not steady (``final_sentence`` says why); 1.0 when the final configuration is that
        baseline, measured steadily. With a first step on another device (a CPU baseline before a GPU ladder),
        ``start_step`` and ``final_vs_start`` (and its sentence) give that ratio, as context only."""
        base, best, start = self.device_baseline(), self.best(), self.baseline()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        lab = self.labels()
        out: dict[str, Any] = {"final_config": dict(self.current), "final_step": best["step"],
                               "final_batch_size": best.get("batch_size") or self.current.get("batch_size"),
                               "baseline_step": base["step"],
                               "steps_not_kept": [r["step"] for r in self.rows if r["applicable"] and not r["kept"]],
                               "retried": {r["retry_of"]: r["decision"] for r in self.rows if r.get("retry_of")},
                               "baseline_steady": unsteady_reason(base) is None}
        if best is base:
            refused = unsteady_reason(base)
            out["final_speedup"] = None if refused else 1.0
            out["final_sentence"] = (
                f"No ratio reported: {refused}; no step was kept over the baseline ({base['step']})." if refused else
                f"No step beat the baseline ({base['step']}) beyond the noise on this machine: the final "
                f"configuration is the baseline.")
        else:
            a, b = (self.final["final"], self.final["baseline"]) if self.final else (best, base)
            refused = unsteady_reason(b) or unsteady_reason(a)
            out["final_speedup"] = None if refused else _stats(a)["throughput"] / _stats(b)["throughput"]
            out["final_sentence"] = compare_sentence(a, b, a_label=lab["final"], b_label=lab["baseline"])
        if start is not base:
            a = self.final["final"] if self.final else best
            c = self.final["start"] if self.final and "start" in self.final else start
            refused = unsteady_reason(c) or unsteady_reason(a)
            out.update(start_step=start["step"],
                       final_vs_start=None if refused else _stats(a)["throughput"] / _stats(c)["throughput"],
                       final_vs_start_sentence=compare_sentence(a, c, a_label=lab["final"], b_label=lab["start"]))
        return out
