"""The one decision rule for "A is faster than B", with a stated false-positive rate.

Why a rule and not a look at two medians: two medians of five noisy repeats differ by chance, and a rule that
calls every such difference "faster" keeps no-ops. Run on identical configurations, "higher median and disjoint
interquartile bands" kept 10 % of no-op steps at 5 repeats, and 1 ladder in 3 with four no-op steps kept one. The rule here is built so that, on identical
configurations, it says "faster" in at most ``ALPHA`` (1 %) of the comparisons, whatever the noise looks like
(as long as the two configurations are timed interleaved, so that the noise hits both alike):

1. **A rank test that fits small samples.** Timed interleaved, A and B run in rounds (A B, then B A, ...): in
   each round the machine is in the same state for both, so the round's log-ratio of their times per item is
   the difference the change makes, with the drift of the machine taken out. If A and B were the same, each
   round's log-ratio would be as likely positive as negative, and the exact Wilcoxon signed-rank test says how
   unlikely it is that they lean this much one way (no normal approximation, no assumption on the shape of
   the noise). It needs at least 7 rounds that all agree to reach 1 % (2**-7 < 0.01): fewer repeats are
   "undecided", whatever the gap. From the same ranks comes a confidence interval for the throughput ratio
   (Hodges-Lehmann: the median of the Walsh averages of the log-ratios, bounded by the order statistics the
   test allows). Measurements with different numbers of repeats (not timed round by round) use the exact
   Mann-Whitney test on every pair of repeats instead.
2. **A minimum practical effect** (``MIN_EFFECT``, 3 %), applied to the confidence interval, not to the point
   estimate: "faster" means that the interval's lower bound is at least 1 + ``MIN_EFFECT`` (the whole interval
   clears 3 %), "slower" that its upper bound is at most 1 / (1 + ``MIN_EFFECT``). A difference the test sees but
   that may be smaller than that is not called "faster" (a 0.5 % gain is not worth a change of configuration, and
   small biases of a machine, such as which configuration runs first, are of that size); a true 2 % gain is then
   called "faster" about as rarely as a no-op is (tests/test_decide.py measures it).
3. **Adaptive repeats with a cap.** :func:`dlo.measure.bench.measure_interleaved` (``max_repeats=``) adds
   interleaved rounds until the decision is clear or the cap is reached; the test is then run at a few fixed
   round counts (:func:`looks`), and each look that could show a difference gets ``ALPHA / number of such
   looks`` (Bonferroni, :func:`useful_looks`), so that looking several times does not raise the false-positive
   rate above ``ALPHA``. What is still unclear at the cap is
   reported as "undecided", never as kept and never with a ratio.

The outcomes of :func:`decide`: "faster", "slower", "same" (the confidence interval of the ratio lies within
``SAME_WITHIN`` of 1), "undecided" (not clear at the cap), "unsteady" (:func:`unsteady_reason`: no ratio from a
measurement that is not steady).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping


#: The widest spread of the timed repeats, as interquartile range / median, for which a ratio is still
#: reported: beyond it the repeats disagree so much that the machine was not steady while they ran.
MAX_SPREAD = 0.25

#: The largest probability of calling "faster" (or, alike, "slower") on two identical configurations, per decision,
#: all looks of the adaptive loop together.
ALPHA = 0.01
#: The smallest gain called "faster": the confidence interval's lower bound of the throughput ratio must be at least
#: 1 + MIN_EFFECT (the whole interval clears it, not only the point estimate).
MIN_EFFECT = 0.03
#: "same" when the whole confidence interval of the throughput ratio lies within 1 +- SAME_WITHIN.
SAME_WITHIN = 0.05
#: The outcomes of a decision.
OUTCOMES = ("faster", "slower", "same", "undecided", "unsteady")
#: The optimisation ladder's decision for each outcome (:class:`dlo.measure.ladder.Ladder`).
DECISIONS = {"faster": "kept", "slower": "slower", "same": "not faster beyond noise",
             "undecided": "undecided: not kept", "unsteady": "not steady: not kept"}
#: Stored with every recorded conclusion: sentences written under another rule cannot be written again here.
RULE = "rank test, alpha 0.01, min effect 3 % on the interval's bound"


def stats(x: Any) -> dict[str, Any]:
    """The numbers a comparison needs, from a :class:`dlo.measure.bench.Measurement` or its record (e.g. read back
    from results.json); the quartiles as :func:`dlo.measure.bench.quartiles` computes them."""
    rec = _fields(x) if hasattr(x, "to_record") else x
    items = rec["items_per_call"]
    times = rec.get("times_s")
    if times:
        median = statistics.median(times)
        q25, q75 = (times[0], times[0]) if len(times) == 1 else statistics.quantiles(times, n=4, method="inclusive")[::2]
    else:
        median, q25, q75 = rec["median_s"], rec.get("q25_s", rec["median_s"]), rec.get("q75_s", rec["median_s"])
    return {"name": rec.get("name") or rec.get("step") or "?", "unit": rec.get("unit", "img/s"), "items": items,
            "steady": rec.get("steady"), "throughput": items / median, "low": items / q75, "high": items / q25,
            "spread": (q75 - q25) / median if median > 0 else 0.0, "repeats": len(times) if times else None,
            "times": list(times or []), "min_repeats": rec.get("min_repeats"), "max_repeats": rec.get("max_repeats")}


def _fields(m: Any) -> dict[str, Any]:
    """What :func:`stats` reads from a Measurement (its record without the copies and derived values)."""
    return {k: getattr(m, k) for k in ("name", "unit", "items_per_call", "steady", "times_s", "min_repeats",
                                       "max_repeats")}


def unsteady_reason(x: Any, max_spread: float = MAX_SPREAD) -> str | None:
    """Why no ratio may be computed from ``x``, or None when it is steady: its warm-up did not reach steady
    timings, or its timed repeats spread more than ``max_spread`` (interquartile range / median)."""
    s = stats(x)
    if s["steady"] is False:
        return f"the warm-up of {s['name']} did not reach steady timings"
    if s["spread"] > max_spread:
        return (f"the repeats of {s['name']} spread over {s['spread']:.0%} of their median (interquartile range), "
                f"more than {max_spread:.0%}: the machine was not steady")
    return None


def looks(min_repeats: int, max_repeats: int | None = None) -> list[int]:
    """The round counts at which the adaptive loop runs the test: ``min_repeats``, then about 1.5 times more
    each time, up to ``max_repeats`` (5, 8 for a cap of 8; 5, 8, 12, 18, 20 for a cap of 20)."""
    cap = max(min_repeats, max_repeats or min_repeats)
    out = [min_repeats]
    while out[-1] < cap:
        out.append(min(cap, max(out[-1] + 1, math.ceil(out[-1] * 1.5))))
    return out


def useful_looks(min_repeats: int, max_repeats: int | None = None, alpha: float = ALPHA) -> int:
    """How many of the :func:`looks` can show a difference at all, and so share ``alpha``: a look at n rounds
    can only when 2**-n (all n rounds agree) is within its share. The looks at too few rounds cost nothing."""
    planned = looks(min_repeats, max_repeats)
    n_looks = len(planned)
    while True:
        useful = sum(1 for n in planned if 2.0 ** -n <= alpha / n_looks)
        if useful >= n_looks:
            return max(1, useful)
        n_looks = max(1, useful)
        if useful == 0:
            return 1


@lru_cache(maxsize=256)
def _null_cdf(m: int, n: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0..m*n, U the Mann-Whitney count of two samples of sizes m and n from one distribution.
    Exact: the counts of arrangements are the coefficients of the Gaussian binomial [m+n choose m]_q."""
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)
        for j in range(len(grown) - 1, n + i - 1, -1):  # times (1 - q^(n+i))
            grown[j] -= grown[j - n - i]
        for j in range(i, len(grown)):  # divided by (1 - q^i)
            grown[j] += grown[j - i]
        while len(grown) > 1 and grown[-1] == 0:
            grown.pop()
        poly = grown
    total = math.comb(m + n, m)
    cdf, acc = [], 0
    for c in poly:
        acc += c
        cdf.append(acc / total)
    return tuple(cdf)


@lru_cache(maxsize=256)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(T <= t) for t = 0..n(n+1)/2, T the Wilcoxon signed-rank sum of n differences symmetric about 0 (each
    rank's sign a fair coin). Exact: the counts are the coefficients of prod_{i=1..n} (1 + q^i)."""
    poly = [1]
    for i in range(1, n + 1):
        grown = poly + [0] * i
        for j in range(len(grown) - 1, i - 1, -1):
            grown[j] += grown[j - i]
        poly = grown
    total, cdf, acc = 2 ** n, [], 0
    for c in poly:
        acc += c
        cdf.append(acc / total)
    return tuple(cdf)


def _rank(cdf: tuple[float, ...], alpha: float) -> int:
    """How many of the ordered estimates (pairwise differences, or Walsh averages) lie outside each end of the
    (1 - 2 alpha) confidence interval: the largest k with P(statistic <= k - 1) <= alpha (0: no interval, too
    few repeats for this alpha)."""
    return sum(1 for p in cdf if p <= alpha)


def _estimates(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> tuple[list[float], tuple[float, ...], str]:
    """The sorted estimates of log(throughput of A / throughput of B), the null distribution that bounds them, and
    what they come from. Interleaved repeats (as many of each, round by round): the per-round log-ratios, whose Walsh
    averages (the means of every two of them, and each one) bound the median log-ratio with the Wilcoxon
    signed-rank test; a drift of the machine hits both sides of a round alike and cancels. Otherwise (different
    counts): every pairwise difference, with the Mann-Whitney test."""
    la = [math.log(t / sa["items"]) for t in sa["times"]]
    lb = [math.log(t / sb["items"]) for t in sb["times"]]
    if len(la) == len(lb):
        d = [y - x for x, y in zip(la, lb)]  # > 0 where A took less time per item in that round
        walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
        return walsh, _signed_rank_cdf(len(d)), f"{len(d)} interleaved rounds"
    return sorted(y - x for x in la for y in lb), _null_cdf(len(la), len(lb)), f"{len(la)} and {len(lb)} repeats"


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` found for "is A faster than B": ``outcome`` (one of :data:`OUTCOMES`), the throughput
    ratio A/B (medians; None when no ratio may be given: unsteady or undecided), its confidence interval
    (``low``, ``high``), the repeats per side, the per-look ``alpha`` used, and ``reason`` in words."""

    outcome: str
    ratio: float | None
    low: float | None
    high: float | None
    repeats: tuple[int, int]
    alpha: float
    reason: str

    @property
    def clear(self) -> bool:
        """Whether the question is settled: "faster", "slower" or "same"."""
        return self.outcome in ("faster", "slower", "same")


def decide(a: Any, b: Any, *, alpha: float = ALPHA,
           min_effect: float = MIN_EFFECT, same_within: float = SAME_WITHIN, n_looks: int | None = None) -> Decision:
    """Whether ``a`` is "faster", "slower", "same" as ``b``, "undecided", or "unsteady" (see the module's rule).

    ``n_looks``: how many times the adaptive loop may test (default: from the measurements' ``min_repeats`` and
    ``max_repeats``, 1 for a fixed number of repeats); each look uses ``alpha / n_looks``."""
    sa, sb = stats(a), stats(b)
    if n_looks is None:
        n_looks = max(useful_looks(s["min_repeats"] or s["repeats"] or 1, s["max_repeats"], alpha) for s in (sa, sb))
    per_look = alpha / max(1, n_looks)
    m, n = len(sa["times"]), len(sb["times"])
    reason = unsteady_reason(b) or unsteady_reason(a)
    if reason:
        return Decision("unsteady", None, None, None, (m, n), per_look, reason)
    if not m or not n:
        return Decision("undecided", None, None, None, (m, n), per_look, "the repeats were not recorded")
    diffs, cdf, test = _estimates(sa, sb)
    k = _rank(cdf, per_look)
    if k == 0:
        return Decision("undecided", None, None, None, (m, n), per_look,
                        f"{m} and {n} repeats are too few to show any difference at a {per_look:.2g} "
                        f"false-positive rate")
    low, high = math.exp(diffs[k - 1]), math.exp(diffs[len(diffs) - k])
    ratio = math.exp(statistics.median(diffs))  # the estimate the interval bounds (Hodges-Lehmann)
    interval = f"{100 * (1 - 2 * per_look):.3g}% interval {low:.3g}x-{high:.3g}x over {test}"
    if low >= 1 + min_effect:  # the whole interval clears the minimum effect, not only the estimate
        return Decision("faster", ratio, low, high, (m, n), per_look, interval)
    if high <= 1 / (1 + min_effect):
        return Decision("slower", ratio, low, high, (m, n), per_look, interval)
    if 1 / (1 + same_within) <= low and high <= 1 + same_within:
        return Decision("same", ratio, low, high, (m, n), per_look, f"{interval}, within {same_within:.0%} of 1")
    return Decision("undecided", None, low, high, (m, n), per_look, f"{interval}: not clear")


def pair_decider(a_name: str, b_name: str, **options: Any):
    """For :func:`dlo.measure.bench.measure_interleaved`'s ``until=``: a function of the measurements so far that
    says whether the decision of ``a_name`` against ``b_name`` is clear."""
    def clear(ms: Mapping[str, Any]) -> bool:
        if ms[a_name].steady is False or ms[b_name].steady is False:  # more rounds cannot make a warm-up steady
            return True
        return decide(ms[a_name], ms[b_name], **options).clear

    return clear

