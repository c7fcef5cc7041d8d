"""Jour 1's helpers (dlo.lessons.jour1): the student's timer set beside the library's, the ladder's outcome sentence,
and the timer checker's simulated device against its own reference."""
from __future__ import annotations

import time

import pytest
import torch

from dlo.course.checks import jour1_timer
from dlo.lessons import jour1 as lesson
from dlo.measure import verdicts
from dlo.measure.bench import Measurement


def _fixed(seconds):
    """A time_step that runs the step once per timed call and reads ``seconds`` for it (a clock of its own)."""
    def time_step(step, sync, warmup, repeats):
        for _ in range(warmup + repeats):
            step()
        return [seconds] * repeats
    return time_step


def _library(seconds):
    def timer(fn):
        fn()
        return seconds
    return timer


def test_the_two_timers_agree_or_disagree_by_the_decision_rule_and_the_sentence_is_recorded():
    cpu = torch.device("cpu")
    results: dict = {}
    text = lesson.compare_timers(results, _fixed(0.02), lambda: None, device=cpu, items=1, warmup=2, rounds=8,
                                 timer=_library(0.002))
    assert text.startswith("**They disagree") and results["timer_agreement"] == "slower"
    assert verdicts.check_conclusions(results) == [] and len(results["conclusions"]) == 1
    results = {}
    text = lesson.compare_timers(results, _fixed(0.002), lambda: None, device=cpu, items=1, warmup=3, rounds=8,
                                 timer=_library(0.002))
    assert text.startswith("**They agree") and results["timer_agreement"] == "same"


def test_the_reference_timer_on_the_simulated_device_times_each_call_s_work():
    for w, r in jour1_timer.CASES:
        dev = jour1_timer.FakeDevice()
        with jour1_timer.fake_clock(dev, jour1_timer.reference):
            got = jour1_timer.reference(dev.step, dev.sync, w, r)
        assert got == pytest.approx([jour1_timer.work_s(k) for k in range(w, w + r)], rel=1e-9)
        assert dev.calls == w + r and time.perf_counter is not dev.clock


def test_the_ladder_outcome_names_what_was_kept_and_left_out():
    lad = verdicts.Ladder(device="cpu", dtype=None, batch_size=8)
    lad.record("0 baseline", Measurement("0 baseline", [1.0] * 9, 8, steady=True))
    lad.record("1 GPU", reason="no GPU")
    lad.record("2 faster", Measurement("2 faster", [0.5] * 9, 8, steady=True), dtype="bf16")
    lad.record("3 slower", Measurement("3 slower", [2.0] * 9, 8, steady=True), channels_last=True)
    text = lesson.ladder_outcome(lad, torch.device("cpu"))
    assert "kept: 2 faster." in text and "3 slower (slower)" in text and "Not applicable here: 1 GPU" in text
