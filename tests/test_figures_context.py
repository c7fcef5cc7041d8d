"""The ring-attention picture of context_parallel.ipynb is the library's ring order: the K/V block drawn for each
(rank, step) is the one dlo.parallel.context's ring attends to there, for cp = 2, 3, 4."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

from dlo.lessons.figures.context import ring_figure
from dlo.lessons.figures.style import drawn
from dlo.parallel import context as C


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _drawn_blocks(fig) -> dict[tuple[int, int], int]:
    return {(t[1], t[2]): t[3] for t in (d["tag"] for d in drawn(fig, "box")) if t and t[0] == "kv"}


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_drawn_blocks_are_the_rings_order(cp):
    blocks = _drawn_blocks(ring_figure(cp))
    assert blocks == {(r, s): C.ring_source(r, s, cp) for r in range(cp) for s in range(cp)}
    # every rank meets every block once
    assert all(sorted(blocks[(r, s)] for s in range(cp)) == list(range(cp)) for r in range(cp))


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_drawn_blocks_follow_the_rings_sends(cp):
    """Blocks start at home and, at each step that posts [send to +1, receive from -1], move one rank on."""
    held = list(range(cp))
    expected = {}
    for step, ops in enumerate(C.ring_schedule(cp)):
        expected.update({(r, step): held[r] for r in range(cp)})
        if ops:
            assert ops == [("send", +1), ("recv", -1)]
            held = [held[(r - 1) % cp] for r in range(cp)]
    assert _drawn_blocks(ring_figure(cp)) == expected


@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("layout", ["balanced", "contiguous"])
def test_drawn_chunks_are_what_the_simulated_ring_attends(cp, layout, monkeypatch):
    """simulate_ring (the library's ring run in one process): the chunks each rank attends, step by step."""
    seen: list[list[int]] = []
    attend = C._Accumulator.attend

    def spy(self, k, v, k_chunks):
        seen.append(list(k_chunks))
        return attend(self, k, v, k_chunks)

    monkeypatch.setattr(C._Accumulator, "attend", spy)
    q = torch.randn(1, 1, 2 * cp * 2, 4)
    C.simulate_ring(q, q, q, cp, layout=layout)
    fig = ring_figure(cp, layout)
    texts = {(d["tag"][1], d["tag"][2]): d["text"] for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "kv"}
    for i, chunks in enumerate(seen):
        rank, step = divmod(i, cp)
        assert texts[(rank, step)].endswith(f"chunks {chunks}")
