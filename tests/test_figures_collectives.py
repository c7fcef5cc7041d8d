"""The collectives figure and the ring all-reduce picture hold what torch.distributed computes: the drawn
"after" buffers equal the demo worker's results on 2 and 3 gloo processes, and the simulated ring leaves the
all-reduce on every rank after 2 (N - 1) steps for N = 2, 3, 4."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

import dlo  # noqa: F401
from dlo.lessons import collectives_demo
from dlo.lessons.figures.collectives import (COLLECTIVES, before, collectives_figure, drawn_after, reference,
                                             ring_allreduce, ring_figure)
from dlo.lessons.figures.style import drawn
from dlo.runtime.launch import launch_forked


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_the_drawn_after_buffers_are_what_torch_distributed_computes(world, tmp_path):
    records = launch_forked(collectives_demo.__file__, nproc=world, records_dir=tmp_path, timeout_s=240,
                            env={"OMP_NUM_THREADS": "1"})
    fig = collectives_figure(world)
    for name in COLLECTIVES:
        rows = sorted((r for r in records if r["collective"] == name), key=lambda r: r["rank"])
        assert [r["before"] for r in rows] == before(name, world)
        assert drawn_after(fig, name, world) == [r["after"] for r in rows], name


def test_the_references_on_hand_computed_cases():
    assert reference("all_to_all", [[1, 2], [3, 4]]) == [[1, 3], [2, 4]]
    assert reference("reduce_scatter", [[1, 2], [3, 4]]) == [[4], [6]]
    assert reference("all_gather", [[1], [2], [3]]) == [[1, 2, 3]] * 3
    with pytest.raises(ValueError, match="unknown collective"):
        before("gather", 2)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_ring_ends_on_the_all_reduce_after_2_n_minus_1_steps(world):
    start = before("all_reduce", world)
    states = ring_allreduce(start)
    assert len(states) - 1 == 2 * (world - 1)
    assert states[-1]["chunks"] == reference("all_reduce", start)
    middle = states[world - 1]["chunks"]  # after the reduce-scatter: rank r holds the sum of chunk (r + 1) mod N
    total = reference("all_reduce", start)[0]
    assert all(middle[r][(r + 1) % world] == total[(r + 1) % world] for r in range(world))
    assert all(len(s["sends"]) == world for s in states[1:])  # every rank sends one chunk per step
    fig = ring_figure(world)
    last = len(states) - 1
    tags = [(d["tag"], d["text"]) for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "chunk"]
    shown = {(t[2], t[3]): float(text) for t, text in tags if t[1] == last}
    assert [[shown[r, c] for c in range(world)] for r in range(world)] == [total] * world
