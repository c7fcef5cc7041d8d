"""The picture of tp_pipeline/grid.ipynb's process grid is drawn from the Grid: every rank once per panel at its
coordinates, and the groups outlined on each axis are the Grid's groups, for layouts whose axis sizes are all
distinct, with a context-parallel axis and with an axis of size 1."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from dlo.lessons.figures.grid import drawn_groups, grid_figure, rank_position  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402
from dlo.runtime.grid import AXES, Grid  # noqa: E402

LAYOUTS = [dict(dp=2, pp=3, tp=4), dict(dp=4, pp=3, tp=2), dict(dp=3, pp=1, tp=2), dict(dp=1, pp=4, tp=2),
           dict(dp=2, pp=3, cp=4, tp=1), dict(dp=4, pp=2, cp=3, tp=1), dict(dp=2, pp=2, tp=2)]


@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "x".join(f"{a}{s.get(a, 1)}" for a in AXES))
def test_the_drawn_groups_are_the_grids(sizes):
    world = 1
    for a in AXES:
        world *= sizes.get(a, 1)
    grid = Grid(world, **sizes)
    fig = grid_figure(grid)
    groups = drawn_groups(fig)
    shown = [a for a in AXES if getattr(grid, a) > 1]
    assert sorted(groups) == sorted(shown)
    for axis in shown:
        assert groups[axis] == grid.groups(axis), axis
    ranks = [d["tag"] for d in drawn(fig, "box") if isinstance(d["tag"], tuple) and d["tag"][0] == "rank"]
    for axis in shown:
        mine = [t for t in ranks if t[1] == axis]
        assert sorted(t[2] for t in mine) == list(range(world))
        for _, _, rank, coords, g in mine:
            assert dict(zip(AXES, coords)) == grid.coords(rank)
            assert rank in grid.groups(axis)[g]  # coloured by its own group
    ones = [a for a in AXES if getattr(grid, a) == 1]
    notes = " ".join(d["text"] for d in drawn(fig, "label"))
    assert all(a in notes.split("each rank alone): ")[1] for a in ones) if ones else True
    matplotlib.pyplot.close(fig)


def test_positions_follow_the_axes():
    grid = Grid(24, dp=2, pp=3, cp=2, tp=2)
    for rank in range(24):
        c = grid.coords(rank)
        x, y = rank_position(grid, rank)
        assert y == -c["pp"]
        same_row = [r for r in range(24) if grid.coords(r)["pp"] == c["pp"]]
        assert sorted(same_row, key=lambda r: rank_position(grid, r)[0]) == sorted(same_row, key=lambda r: (
            grid.coords(r)["dp"], grid.coords(r)["cp"], grid.coords(r)["tp"]))
