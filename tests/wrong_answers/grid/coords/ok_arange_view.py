"""Correct, written another way: the coordinates read off torch.arange(world).view(dp, pp, cp, tp), the neighbours
found by moving one step along the pp axis of that same view."""
import torch


def _grid(dp, pp, cp, tp):
    return torch.arange(dp * pp * cp * tp).view(dp, pp, cp, tp)


def rank_coords(rank, dp, pp, cp, tp):
    where = (_grid(dp, pp, cp, tp) == rank).nonzero()[0].tolist()
    return dict(zip(("dp", "pp", "cp", "tp"), where))


def pp_peers(rank, dp, pp, cp, tp):
    grid = _grid(dp, pp, cp, tp)
    d, s, c, t = (grid == rank).nonzero()[0].tolist()
    before = int(grid[d, s - 1, c, t]) if s >= 1 else None
    after = int(grid[d, s + 1, c, t]) if s + 1 < pp else None
    return before, after
