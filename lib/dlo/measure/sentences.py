"""The sentences that state a measured outcome, written from the decision rule, and the record of each one.

The timing itself (warm-up until steady, interleaved repeats, median and spread) is :mod:`dlo.measure.bench`;
this module only reads its :class:`~dlo.measure.bench.Measurement` objects, or their records read back from a
results.json, and decides:

- :func:`faster_beyond_noise`: the rule every decision uses, :func:`dlo.measure.decide.decide` (an exact rank test
  on the interleaved repeats at a stated false-positive rate, a minimum practical effect, "undecided" when the
  repeats cannot tell);
- :func:`unsteady_reason`: why no ratio may be given (warm-up not steady, or repeats spread too wide);
- :func:`compare_sentence` / :func:`break_even_sentence` / :func:`retry_sentence`: a sentence written from the
  numbers, hedged when the difference is within the noise; :func:`conclude` records it with the numbers behind it, and
  :func:`check_conclusions` writes every recorded sentence again from its numbers (a test runs it on each
  notebook's results.json, so prose cannot drift from the measurement);
- :class:`Ladder` (:mod:`dlo.measure.ladder`): a sequence of optimisation steps, each kept or not by that rule,
  the steps left out tried again at the batch the sweep chose, and the headline against the fp32 baseline of the
  same device.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from dlo.measure.bench import MAX_SPREAD, Measurement, format_number
from dlo.measure.decide import DECISIONS, RULE, Decision, decide, stats as _stats
from dlo.measure.decide import unsteady_reason as _unsteady_reason

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


def unsteady_reason(x: Measurement | Mapping[str, Any], max_spread: float = MAX_SPREAD) -> str | None:
    """Why no ratio may be computed from ``x``, or None when it is steady: its warm-up did not reach steady
    timings, or its timed repeats spread more than ``max_spread`` (interquartile range / median)."""
    return _unsteady_reason(x, max_spread)


def faster_beyond_noise(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any],
                        **options: Any) -> bool:
    """Whether ``a`` is faster than ``b`` beyond the noise: the decision rule (:func:`dlo.measure.decide.decide`,
    ``options`` passed on) says "faster" -- a rank test on the repeats at a 1 % false-positive rate, and a gain
    of at least 3 %. False when it says anything else, "undecided" included."""
    return decide(a, b, **options).outcome == "faster"


def _numbers(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    return f"{format_number(sa['throughput'])} vs {format_number(sb['throughput'])} {sa['unit']}, medians"


def _beyond(d: Decision) -> str:
    return f"beyond the noise: {d.reason}"


def compare_sentence(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any], *,
                     a_label: str | None = None, b_label: str | None = None) -> str:
    """One sentence comparing the throughputs of ``a`` and ``b`` (Measurements or their records), written
    from the decision rule (:func:`dlo.measure.decide.decide`): "A is 3.6x faster than B on this machine (...)",
    "A is slower than B on this machine: 0.50x its throughput (...)", "A against B: no measurable difference on
    this machine (...)", "A against B: undecided on this machine (...)" (no ratio), or, when either is not
    steady (:func:`unsteady_reason`), why no ratio is given."""
    sa, sb = _stats(a), _stats(b)
    la, lb = a_label or sa["name"], b_label or sb["name"]
    d = decide(a, b)
    if d.outcome == "unsteady":
        return f"No ratio reported for {la} against {lb}: {d.reason}, so any ratio would be noise."
    numbers = _numbers(sa, sb)
    if d.outcome == "faster":
        return f"{la} is {format_ratio(d.ratio)} faster than {lb} on this machine ({numbers}; {_beyond(d)})."
    if d.outcome == "slower":
        return (f"{la} is slower than {lb} on this machine: {format_ratio(d.ratio)} its throughput ({numbers}; "
                f"{_beyond(d)}).")
    if d.outcome == "same":
        return f"{la} against {lb}: no measurable difference on this machine (within the noise: {numbers}; {d.reason})."
    return (f"{la} against {lb}: undecided on this machine ({numbers}; {d.reason} within the repeats allowed), "
            f"so no ratio is given.")


def break_even_sentence(compiled: Measurement | Mapping[str, Any], eager: Measurement | Mapping[str, Any],
                        compile_seconds: float) -> str:
    """Whether a compilation that cost ``compile_seconds`` pays off, from the measured steps: after how
    many steps the time saved per step adds up to it, or that it does not pay off here (not faster beyond
    the noise), or why no figure is given (not steady)."""
    sc, se = _stats(compiled), _stats(eager)
    d = decide(compiled, eager)
    if d.outcome == "unsteady":
        return f"No break-even reported for {sc['name']}: {d.reason}."
    if d.outcome == "undecided":
        return (f"No break-even reported for {sc['name']}: whether it is faster than {se['name']} is undecided on "
                f"this machine ({_numbers(sc, se)}; {d.reason}).")
    if d.outcome == "faster":
        # a compiled step of N items saves N x (eager - compiled) seconds per item
        saved_per_step = sc["items"] * (1 / se["throughput"] - 1 / sc["throughput"])
        return (f"{sc['name']} is {format_ratio(d.ratio)} faster than {se['name']}: "
                f"its first call ({compile_seconds:.1f} s, compilation included) is paid back after about "
                f"{math.ceil(compile_seconds / saved_per_step):,} steps.")
    return (f"{sc['name']} is not faster than {se['name']} beyond the noise on this machine "
            f"({_numbers(sc, se)}): the {compile_seconds:.1f} s compilation does not pay off here.")


def _outcome(a: Measurement | Mapping[str, Any], b: Measurement | Mapping[str, Any]) -> tuple[str, str, str]:
    """How ``a`` did against ``b``: ``(kind, verdict, numbers)``, kind one of the decision's outcomes; the
    verdict follows "was" or "is" in a sentence, the numbers go in brackets after it."""
    sa, sb = _stats(a), _stats(b)
    d = decide(a, b)
    if d.outcome == "unsteady":
        return "unsteady", "not measured steadily", f"{d.reason}, so no ratio is given"
    numbers = _numbers(sa, sb)
    if d.outcome == "faster":
        return "faster", f"{format_ratio(d.ratio)} faster", f"{numbers}; {_beyond(d)}"
    if d.outcome == "slower":
        return "slower", "slower", f"{format_ratio(d.ratio)} the throughput: {numbers}; {_beyond(d)}"
    if d.outcome == "same":
        return "same", "not faster beyond the noise", f"{numbers}; {d.reason}"
    return "undecided", "undecided", f"{numbers}; {d.reason}, so no ratio is given"


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
    if reference_batch is not None and reference_batch != batch and k2 not in ("unsteady", "undecided"):
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
        {"kind": kind, "a": _plain(a), "b": _plain(b), "args": dict(args), "sentence": sentence, "rule": RULE})
    return sentence


def check_conclusions(results: Mapping[str, Any]) -> list[str]:
    """Every recorded conclusion written again from its recorded numbers, and, for a ladder's results (Jour 1),
    every row's decision and ratio and the headline (``final_speedup``, ``final_sentence``) decided again from
    theirs (also for the ladder of a second workload, ``results["imagenet"]``): one line per statement that the numbers do not give (an empty list: every stated outcome is what was
    measured)."""
    problems = []
    for i, c in enumerate(results.get("conclusions", [])):
        helper = CONCLUSION_HELPERS.get(c.get("kind"))
        if helper is None:
            problems.append(f"conclusion {i}: unknown kind {c.get('kind')!r}")
            continue
        if "rule" in c and c["rule"] != RULE:
            problems.append(f"conclusion {i} was written under another decision rule ({c.get('rule')!r}, now "
                            f"{RULE!r}): run the notebook again")
            continue
        expected = helper(c["a"], c["b"], **c.get("args", {}))
        if expected != c.get("sentence"):
            problems.append(f"conclusion {i} says {c.get('sentence')!r} but its numbers give {expected!r}")
    second = results.get("imagenet")  # Jour 1's second workload, a ladder of its own
    nested = _check_ladder(second) if isinstance(second, Mapping) else []
    return problems + _check_ladder(results) + [f"second workload: {p}" for p in nested]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _check_ladder(results: Mapping[str, Any]) -> list[str]:
    """The ladder's rows (``results["ladder"]``) and headline (``final_comparison``, ``final_speedup``,
    ``final_sentence``, ``final_labels``), decided again from their recorded numbers."""
    problems = []
    for row in results.get("ladder") or []:
        ref = row.get("reference")
        if not isinstance(ref, Mapping) or not row.get("times_s"):
            continue
        d = decide(row, ref)
        ratio = None if _missing(row.get("vs_best")) else row["vs_best"]
        if row.get("decision") != DECISIONS[d.outcome] and not row.get("decision", "").startswith("failed"):
            problems.append(f"ladder row {row.get('step')!r} says {row.get('decision')!r} but its numbers give "
                            f"{DECISIONS[d.outcome]!r}")
        if (ratio is None) != (d.ratio is None) or (ratio is not None and not math.isclose(ratio, d.ratio)):
            problems.append(f"ladder row {row.get('step')!r} shows the ratio {ratio!r} but its decision gives {d.ratio!r}")
    ladder = results.get("ladder") or []
    if ladder and "undecided_steps" in results:
        unclear = [r.get("step") for r in ladder if r.get("applicable") and r.get("decision") != "baseline"
                   and str(r.get("decision")).startswith(("undecided", "not steady"))]
        if sorted(unclear) != sorted(results["undecided_steps"]):
            problems.append(f"undecided_steps is {results['undecided_steps']!r} but the ladder's rows give {unclear!r}")
        if "No step beat the baseline" in str(results.get("final_sentence")) and unclear:
            problems.append(f"the summary says no step beat the baseline while {unclear!r} could not be decided")
    final = results.get("final_comparison") or {}
    if "final" in final and "baseline" in final and "final_speedup" in results:
        d = decide(final["final"], final["baseline"])
        expected = d.ratio if d.outcome in ("faster", "slower", "same") else None
        said = results["final_speedup"]
        if (said is None) != (expected is None) or (said is not None and not math.isclose(said, expected)):
            problems.append(f"final_speedup is {said!r} but the final comparison gives {expected!r} ({d.outcome})")
        labels = results.get("final_labels") or {}
        if labels:
            sentence = compare_sentence(final["final"], final["baseline"], a_label=labels.get("final"),
                                        b_label=labels.get("baseline"))
            if sentence != results.get("final_sentence"):
                problems.append(f"final_sentence says {results.get('final_sentence')!r} but the final comparison "
                                f"gives {sentence!r}")
    return problems
