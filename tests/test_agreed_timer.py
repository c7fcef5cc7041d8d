"""dlo.parallel.agreed_timer on real ranks: every rank gets the slowest rank's time (not the sum, not its own)."""
from __future__ import annotations

from pathlib import Path

import pytest

import dlo  # noqa: F401
from dlo.runtime.launch import launch_forked

SCRIPT = Path(__file__).parent / "scripts" / "agreed_timer_probe.py"


@pytest.mark.distributed
def test_every_rank_takes_the_slowest_ranks_time():
    # exact: rank 0's own timer says 1 s, rank 1's says 3 s; the agreed time is 3 s on both (a sum would be 4)
    records = launch_forked(SCRIPT, ["--fake"], nproc=2, timeout_s=180)
    assert [(r["rank"], r["own"], r["agreed"], r["calls"]) for r in records] == [(0, 1.0, 3.0, 1), (1, 3.0, 3.0, 1)]
    # real sleeps: rank 1 sleeps 0.35 s, rank 0 0.05 s; both take rank 1's measured time
    records = launch_forked(SCRIPT, nproc=2, timeout_s=180)
    agreed = {r["agreed"] for r in records}
    assert len(agreed) == 1 and agreed.pop() >= 0.35 and all(r["calls"] == 1 for r in records)
