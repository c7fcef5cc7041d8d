"""dlo.runtime.grid.Grid: every rank's coordinates and groups in a dp × pp × cp × tp layout, checked against
two independent references: a row-major ``torch.arange`` view, and torch's own DeviceMesh (built for one rank
at a time on the "fake" process-group backend, which needs no peers)."""
from __future__ import annotations

import math
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from dlo.parallel.tensor import dp_group_ranks, tp_group_ranks
from dlo.runtime.grid import AXES, Grid

# odd sizes included: 3 × 2, 3 × 3, a prime world, all four axes at once
LAYOUTS = [dict(dp=2, pp=2, tp=2), dict(dp=3, tp=2), dict(pp=3, tp=3), dict(dp=5), dict(dp=2, pp=3, tp=2),
           dict(dp=2, pp=2, cp=2, tp=3), dict(pp=2, cp=3)]


def _world(layout):
    n = 1
    for v in layout.values():
        n *= v
    return n


def _reference_groups(grid: Grid, axis: str) -> list[list[int]]:
    """The groups along ``axis`` of ``arange(world).view(shape)``: move that axis last, one row per group."""
    mesh = torch.arange(grid.world_size).view(*grid.shape)
    rows = mesh.movedim(AXES.index(axis), -1).reshape(-1, getattr(grid, axis)).tolist()
    return sorted(rows)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "x".join(f"{k}{v}" for k, v in d.items()))
def test_groups_match_a_row_major_mesh(layout):
    grid = Grid(_world(layout), **layout)
    for axis in AXES:
        groups = grid.groups(axis)
        assert sorted(groups) == _reference_groups(grid, axis)
        assert sorted(r for g in groups for r in g) == list(range(grid.world_size))  # each rank once
    for rank in range(grid.world_size):
        assert grid.rank_of(**grid.coords(rank)) == rank
        for axis in AXES:
            members = grid.group(axis, rank)
            assert rank in members and len(members) == getattr(grid, axis)
            others = [a for a in AXES if a != axis]
            assert all(grid.coords(m)[a] == grid.coords(rank)[a] for m in members for a in others)


@pytest.mark.parametrize("layout", LAYOUTS[:4] + LAYOUTS[5:6], ids=lambda d: "x".join(f"{k}{v}" for k, v in d.items()))
def test_groups_match_torch_device_mesh(layout):
    grid = Grid(_world(layout), **layout)
    ranks = sorted({0, 1, grid.world_size // 2, grid.world_size - 1})
    for rank in ranks:
        dist.init_process_group("fake", rank=rank, world_size=grid.world_size, store=FakeStore())
        try:
            mesh = init_device_mesh("cpu", grid.shape, mesh_dim_names=AXES)
            for axis in AXES:
                assert grid.group(axis, rank) == dist.get_process_group_ranks(mesh.get_group(axis)), (axis, rank)
            mine = grid.new_groups()
            for axis in AXES:
                assert dist.get_process_group_ranks(mine[axis]) == grid.group(axis, rank)
        finally:
            dist.destroy_process_group()


def test_tensor_parallel_groups_are_the_grids():
    assert tp_group_ranks(8, 2) == Grid(8, dp=4, tp=2).groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dp_group_ranks(6, 2, 3) == Grid(6, dp=3, tp=2).groups("dp") == [[0, 2, 4], [1, 3, 5]]


def test_worked_example_in_the_docstring():
    g = Grid(8, dp=2, pp=2, tp=2)
    assert g.coords(5) == {"dp": 1, "pp": 0, "cp": 0, "tp": 1}
    assert (g.group("tp", 5), g.group("pp", 5), g.group("dp", 5)) == ([4, 5], [5, 7], [1, 5])
    assert g.describe().splitlines()[0] == "dp (2): [0, 4] [1, 5] [2, 6] [3, 7]"


@pytest.mark.parametrize("kwargs, words", [
    (dict(world_size=6, dp=4, tp=2), "dp=4 × pp=1 × cp=1 × tp=2 = 8 ranks, but the world size is 6"),
    (dict(world_size=4, tp=0), "tp must be a positive integer"),
    (dict(world_size=4, dp=2.0, tp=2), "dp must be a positive integer"),
])
def test_bad_layouts_are_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("×", ".").replace("=", ".")) as info:
        Grid(**kwargs)
    assert "\n" not in str(info.value)


def test_bad_ranks_and_axes_are_one_line():
    g = Grid(4, dp=2, tp=2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 4\)"):
        g.coords(4)
    with pytest.raises(ValueError, match="unknown axis 'ep'"):
        g.groups("ep")
    with pytest.raises(ValueError, match="unknown axis 'ep'"):
        g.rank_of(ep=1)
    with pytest.raises(ValueError, match=r"tp index must be in \[0, 2\)"):
        g.rank_of(tp=2)
    with pytest.raises(RuntimeError, match="needs an initialised process group"):
        g.new_groups()


# ---------------------------------------------------------------------------------------------------
# The grid/coords exercise's checker (dlo.course.checks.grid): its layouts reach every mistake it names
# ---------------------------------------------------------------------------------------------------

def test_the_exercise_layouts_tell_every_axis_order_apart():
    """Every nesting of the four axes other than the grid's gives, on some layout of the checker, some rank other
    coordinates (else that wrong order would pass), and the checker's own replay of the right order is Grid's."""
    import itertools

    from dlo.course.checks import grid as grid_check

    layouts = [dict(zip(AXES, shape)) for shape in grid_check.layouts()]
    for sizes in layouts:
        g = Grid(math.prod(sizes.values()), **sizes)
        assert all(grid_check._coords_in_order(r, sizes, AXES) == g.coords(r) for r in range(g.world_size))
    for order in itertools.permutations(AXES):
        if order == AXES:
            continue
        assert any(grid_check._coords_in_order(r, sizes, order) != Grid(math.prod(sizes.values()), **sizes).coords(r)
                   for sizes in layouts for r in range(math.prod(sizes.values()))), order
    # a layout with cp > 1 (else forgetting cp passes) and one where only pp is > 1 (neighbours one rank apart)
    assert any(s["cp"] > 1 for s in layouts) and any(s["pp"] == math.prod(s.values()) for s in layouts)
