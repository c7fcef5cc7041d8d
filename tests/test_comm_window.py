"""What backward hides of the communication, and what it leaves exposed, read from recorded event times
(dlo.parallel.dp_events.comm_window_s / exposed_comm_s): each part lies between 0 and the communication window,
whatever the order of compute and communication (all after backward, partly overlapped, all inside)."""
from __future__ import annotations

import pytest

from dlo.parallel import comm_window_s, exposed_comm_s


def compute(name, start, end):
    return {"lane": "compute", "name": name, "start_s": start, "end_s": end}


def comm(start, end):
    return {"lane": "comm", "name": "all_reduce", "start_s": start, "end_s": end}


def test_communication_after_backward_hides_nothing_and_exposes_only_its_own_window():
    """Naive data parallelism: backward ends at 1 s, the all-reduces run from 2 s to 4 s. Nothing is hidden (not a
    negative amount), and the exposed part is the 2 s of the window, not the 3 s since backward ended."""
    events = [compute("forward", 0.0, 0.5), compute("backward", 0.5, 1.0), comm(2.0, 3.0), comm(3.5, 4.0)]
    assert comm_window_s(events) == pytest.approx({"comm_s": 2.0, "hidden_s": 0.0, "exposed_s": 2.0})
    assert exposed_comm_s(events) == pytest.approx(2.0)


def test_communication_partly_overlapped_splits_into_hidden_and_exposed():
    events = [compute("forward", 0.0, 1.0), compute("backward", 1.0, 3.0), comm(1.5, 2.5), comm(2.0, 3.75),
              compute("wait", 3.0, 3.75)]
    parts = comm_window_s(events)
    assert parts == pytest.approx({"comm_s": 2.25, "hidden_s": 1.5, "exposed_s": 0.75})
    assert parts["hidden_s"] + parts["exposed_s"] == pytest.approx(parts["comm_s"])
    assert exposed_comm_s(events) == pytest.approx(0.75)


def test_communication_inside_backward_is_all_hidden_and_nothing_exposed():
    """The all-reduces finish 2 s before backward does: exposed is 0 (not -2), hidden the whole 1 s window (not
    the 3 s of backward that follow its launch)."""
    events = [compute("backward", 0.0, 4.0), comm(1.0, 1.5), comm(1.25, 2.0)]
    assert comm_window_s(events) == pytest.approx({"comm_s": 1.0, "hidden_s": 1.0, "exposed_s": 0.0})
    assert exposed_comm_s(events) == 0.0


def test_communication_launched_before_backward_counts_only_its_part_inside_backward_as_hidden():
    events = [compute("forward", 0.0, 2.0), comm(1.0, 3.0), compute("backward", 2.0, 2.5)]
    assert comm_window_s(events) == pytest.approx({"comm_s": 2.0, "hidden_s": 0.5, "exposed_s": 0.5})


def test_without_communication_or_backward_nothing_is_hidden_or_exposed():
    assert comm_window_s([compute("backward", 0.0, 1.0)]) == {"comm_s": 0.0, "hidden_s": 0.0, "exposed_s": 0.0}
    assert comm_window_s([comm(1.0, 2.0)]) == {"comm_s": 1.0, "hidden_s": 0.0, "exposed_s": 0.0}
    assert comm_window_s([comm(1.0, None), compute("backward", 0.0, 3.0)])["comm_s"] == 0.0  # never completed
