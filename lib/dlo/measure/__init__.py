"""Layer 4, measure: honest timing (warm-up until steady, repeats, spread) and the verdicts drawn from it
(faster beyond the noise or not, sentences generated from the numbers, the optimisation ladder), memory and
FLOPs calculators, MFU, the roofline, attention kernels (eager vs SDPA's backends: time and bytes saved for
backward), plots.

The timing and verdict names are importable from here (``from dlo.measure import conclude``); the other
modules by name (``from dlo.measure import memory, flops, roofline, attention, plots``).
"""
from __future__ import annotations

from .bench import (
    Timer, MAX_SPREAD, make_timer, Warmup, warm_up, time_calls, PeakMemory, format_number, quartiles,
    Measurement, Candidate, measure_interleaved, measure, step_call, measure_steps,
)
from .records import cpu_has_native_bf16, environment_info, save_json, load_json, table, torch_threads
from .decide import ALPHA, MIN_EFFECT, Decision, decide
from .verdicts import (
    format_ratio, unsteady_reason, faster_beyond_noise, compare_sentence, break_even_sentence,
    CONCLUSION_HELPERS, conclude, check_conclusions,
)
from .ladder import Ladder

__all__ = [
    "Timer",
    "MAX_SPREAD",
    "make_timer",
    "Warmup",
    "warm_up",
    "time_calls",
    "PeakMemory",
    "format_number",
    "quartiles",
    "Measurement",
    "Candidate",
    "measure_interleaved",
    "measure",
    "step_call",
    "measure_steps",
    "cpu_has_native_bf16",
    "environment_info",
    "save_json",
    "load_json",
    "table",
    "torch_threads",
    "format_ratio",
    "unsteady_reason",
    "faster_beyond_noise",
    "compare_sentence",
    "break_even_sentence",
    "CONCLUSION_HELPERS",
    "conclude",
    "check_conclusions",
    "Ladder",
    "ALPHA",
    "MIN_EFFECT",
    "Decision",
    "decide",
]
