"""dlo.parallel.p2p_replay: the pipeline schedules' transfers, replayed under NCCL's rules, never deadlock.

The transfers are recorded from the real schedule functions running on a DryRunPipe (the Pipe's own
logic of what goes out together, no process group, no computation), one rank at a time, then replayed:
in-order matching per pair of ranks (tags ignored), a send waits for its receive and a receive for its
send, a batch posted with one ``batch_isend_irecv`` completes as a whole.
"""
from __future__ import annotations

import pytest

from dlo.parallel.p2p_replay import DryRunPipe, P2POp, record, replay, replay_schedule
from dlo.parallel.pipeline import interleaved_actions, train_step
from dlo.parallel.pipeline.schedules import _backward, _forward

STAGES = range(2, 9)


def _micro_batches(schedule: str, p: int) -> list[int]:
    if schedule == "naive":
        return [1]
    if schedule == "interleaved":  # micro-batches go in groups of p
        return [p, 2 * p, 3 * p]
    return sorted({1, 2, p - 1, p, p + 1, 2 * p + 1, 3 * p})  # with and without a steady state, m % p != 0


def _grid(p: int) -> list[tuple[str, int, int]]:
    out = []
    for schedule in ("naive", "afab", "1f1b", "interleaved"):
        for v in ((1, 2, 3) if schedule == "interleaved" else (1,)):
            out += [(schedule, m, v) for m in _micro_batches(schedule, p)]
    return out


def test_the_grid_covers_every_schedule():
    configs = [(p, *c) for p in STAGES for c in _grid(p)]
    assert len(configs) == 162
    assert {c[1] for c in configs} == {"naive", "afab", "1f1b", "interleaved"}
    assert any(s == "1f1b" and m % p for p, s, m, _ in configs)


@pytest.mark.parametrize("p", STAGES, ids=lambda p: f"p{p}")
def test_every_schedule_replays_without_deadlock(p):
    for schedule, m, v in _grid(p):
        result = replay_schedule(schedule, p, m, v)
        assert result.ok, f"{schedule}, p={p}, m={m}, v={v}:\n{result.explain()}"
        assert result.batches_done == result.batches


# ----------------------------------------------------------------------------------------------------
# The simulator can fail: the rules on hand-written lists, and the order the Pipe used to post
# ----------------------------------------------------------------------------------------------------
def test_rules_on_hand_written_transfers():
    def op(kind, peer, batch, tag=0):
        return P2POp(kind, peer, batch, tag)

    # both ranks send first, each send alone: each waits for a receive the other never reaches
    r = replay([[op("send", 1, 1, 1), op("recv", 1, 2, 2)], [op("send", 0, 1, 2), op("recv", 0, 2, 1)]])
    assert r.deadlock and not r.ok
    assert r.blocked == {0: [op("send", 1, 1, 1)], 1: [op("send", 0, 1, 2)]}
    assert "rank 0 is stuck in its batch 1 of 2, waiting on: send to rank 1" in r.explain()
    # the same transfers, each rank's send and receive posted together: both batches complete
    r = replay([[op("send", 1, 1, 1), op("recv", 1, 1, 2)], [op("send", 0, 1, 2), op("recv", 0, 1, 1)]])
    assert r.ok and r.batches_done == [1, 1]
    # one rank batched is enough here: rank 1's lone send meets rank 0's posted receive
    r = replay([[op("send", 1, 1, 1), op("recv", 1, 1, 2)], [op("send", 0, 1, 2), op("recv", 0, 2, 1)]])
    assert r.ok
    # a chain of lone sends that ends in a receive drains (no cycle)
    r = replay([[op("send", 1, 1)], [op("recv", 0, 1), op("send", 2, 2)], [op("recv", 1, 1)]])
    assert r.ok
    # the same chain closed into a ring of lone sends: a cycle, nobody receives
    ring = [[op("send", (k + 1) % 3, 1), op("recv", (k - 1) % 3, 2)] for k in range(3)]
    assert replay(ring).deadlock
    # tags are ignored: the first send meets the first receive, even if it carries another tensor
    r = replay([[op("send", 1, 1, 10), op("send", 1, 2, 11)], [op("recv", 0, 1, 11), op("recv", 0, 2, 10)]])
    assert not r.deadlock and not r.ok and len(r.mismatched) == 2
    # a send nobody receives blocks its rank forever
    r = replay([[op("send", 1, 1)], []])
    assert r.blocked == {0: [op("send", 1, 1)]}


def test_old_one_transfer_at_a_time_order_deadlocks_1f1b_not_afab():
    """Before the Pipe batched its transfers it posted each one alone, when asked for: 1F1B with a
    steady state deadlocks under NCCL's rules (it worked on gloo, which buffers small messages)."""
    r = replay_schedule("1f1b", 2, 4, one_at_a_time=True)
    assert r.deadlock
    assert [str(o) for o in r.blocked[0]] == ["send to rank 1 (activation of micro-batch 1, stage 0 -> 1)"]
    assert [str(o) for o in r.blocked[1]] == ["send to rank 0 (gradient of micro-batch 0, stage 1 -> 0)"]
    deadlocks = [(p, m) for p in STAGES for m in _micro_batches("1f1b", p)
                 if replay_schedule("1f1b", p, m, one_at_a_time=True).deadlock]
    assert (8, 24) in deadlocks and len(deadlocks) >= 30
    assert (2, 1) not in deadlocks  # one micro-batch: no steady state, nothing to cross
    for p in STAGES:  # all forwards then all backwards: the transfers never cross, even one at a time
        assert replay_schedule("afab", p, 2 * p + 1, one_at_a_time=True).ok


def _per_action_interleaved(pipe):
    for kind, mb, c in interleaved_actions(pipe.rank, pipe.world_size, pipe.micro_batches, len(pipe.chunks)):
        (_forward if kind == "F" else _backward)(pipe, mb, c)


def test_interleaved_needs_its_steps():
    """Interleaved 1F1B written as receive-compute-send per action deadlocks even with the Pipe's batching
    (the ranks form a ring): the reference asks for a step's two receives before its two computes."""
    r = replay_schedule(_per_action_interleaved, 4, 8, 2)
    assert r.deadlock and set(r.blocked) == {0, 1, 2, 3}
    assert replay_schedule("interleaved", 4, 8, 2).ok


# ----------------------------------------------------------------------------------------------------
# What is posted together
# ----------------------------------------------------------------------------------------------------
def _batches(ops: list[P2POp]) -> list[list[str]]:
    out: dict[int, list[str]] = {}
    for o in ops:
        out.setdefault(o.batch, []).append(f"{o.kind}{o.peer}")
    return list(out.values())


def test_1f1b_steady_state_posts_opposite_directions_together():
    ops = record("1f1b", 4, 8)
    # rank 1: 2 warm-up forwards, 6 steady pairs, 2 cool-down backwards
    got = _batches(ops[1])
    assert got[0] == ["recv0"]  # the first input
    assert ["send2", "recv0"] in got[:3]  # warm-up: the activation out with the next input
    # steady: send-forward + recv-backward (both with stage 2), send-backward + recv-forward (both with stage 0)
    assert got.count(["send2", "recv2"]) == 6 and got.count(["send0", "recv0"]) == 5
    assert got[-1] == ["send0"]  # the last gradient, posted by finish()
    # the last stage never sends forward, the first never sends backward
    assert all(o.peer == 2 for o in ops[3]) and all(not (o.kind == "send" and o.peer == 3) for o in ops[0])


def test_interleaved_steady_state_posts_four_transfers_together():
    got = _batches(record("interleaved", 4, 8, 2)[1])
    four = [b for b in got if len(b) == 4]
    assert four and all(sorted(b) == ["recv0", "recv2", "send0", "send2"] for b in four)


def test_dry_run_pipe_is_a_pipe_without_model():
    pipe = DryRunPipe(1, 4, 8)
    stats = train_step(pipe, "1f1b")
    assert stats.loss is None and len(stats.events) == 16  # 8 forwards, 8 backwards, nothing computed
    assert [(e.kind, e.mb) for e in stats.events][:4] == [("F", 0), ("F", 1), ("F", 2), ("B", 0)]
    assert pipe.batches_posted == len({o.batch for o in pipe.log})
    with pytest.raises(ValueError, match="unknown schedule"):
        record("gpipe", 2, 4)
