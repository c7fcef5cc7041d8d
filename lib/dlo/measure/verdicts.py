"""Verdicts on measurements: whether a difference is beyond the noise (:mod:`dlo.measure.decide`, the one decision
rule), the sentences that state a measured outcome (:mod:`dlo.measure.sentences`) and the optimisation ladder that
keeps a step only when it is faster (:mod:`dlo.measure.ladder`), under one name: ``from dlo.measure import verdicts``.
"""
from __future__ import annotations

from dlo.measure.decide import ALPHA, DECISIONS, MIN_EFFECT, SAME_WITHIN, Decision, decide, looks
from dlo.measure.ladder import Ladder, plot_ladder
from dlo.measure.sentences import (
    CONCLUSION_HELPERS, break_even_sentence, check_conclusions, compare_sentence, conclude, faster_beyond_noise,
    format_ratio, retry_sentence, unsteady_reason,
)

__all__ = ["ALPHA", "MIN_EFFECT", "SAME_WITHIN", "Decision", "decide", "looks", "DECISIONS", "Ladder", "plot_ladder",
           "CONCLUSION_HELPERS", "break_even_sentence", "check_conclusions", "compare_sentence", "conclude",
           "faster_beyond_noise", "format_ratio", "retry_sentence", "unsteady_reason"]
