"""Where every rank sits in a multi-dimensional parallel layout, and its process groups.

A job of ``world_size`` processes that combines data (dp), pipeline (pp), context (cp) and tensor (tp)
parallelism arranges its ranks in a grid of shape ``dp × pp × cp × tp``. Rank ``r`` has one coordinate per
axis, and for each axis it belongs to exactly one group: the ranks that differ from it *only* along that
axis (its tensor-parallel peers, its pipeline neighbours, its data-parallel replicas...).

**Why tp is the innermost axis.** Ranks are numbered node by node, so consecutive ranks share a node. The
innermost axis gets consecutive ranks: tensor parallelism, which communicates inside every layer, stays on
the node's fast links (NVLink), while data parallelism, which communicates once per step, crosses nodes.
The layout is row-major, like ``torch.arange(world_size).view(dp, pp, cp, tp)`` and like
``torch.distributed.device_mesh.init_device_mesh`` with the same shape (tests check both).

:class:`Grid` is pure arithmetic (no process group needed: testable, and a clear error before any launch);
:meth:`Grid.new_groups` creates the groups, which every rank must do for every group in the same order.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch.distributed as dist

from dlo.runtime.validate import is_int

AXES = ("dp", "pp", "cp", "tp")  # outermost first


@dataclasses.dataclass(frozen=True)
class Grid:
    """The ``dp × pp × cp × tp`` layout of ``world_size`` ranks (sizes of 1 for the axes a job does not use).

    >>> g = Grid(8, dp=2, pp=2, tp=2)
    >>> g.coords(5)
    {'dp': 1, 'pp': 0, 'cp': 0, 'tp': 1}
    >>> g.group("tp", 5), g.group("pp", 5), g.group("dp", 5)
    ([4, 5], [5, 7], [1, 5])
    """

    world_size: int
    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", *AXES):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        product = math.prod(self.shape)
        if product != self.world_size:
            sizes = " × ".join(f"{a}={getattr(self, a)}" for a in AXES)
            raise ValueError(f"{sizes} = {product} ranks, but the world size is {self.world_size}: launch "
                             f"{product} processes or change the sizes so that their product is {self.world_size}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, a) for a in AXES)

    def _axis(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}: use one of {', '.join(AXES)}")
        return AXES.index(axis)

    def _check_rank(self, rank: int) -> None:
        if not is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an integer in [0, {self.world_size}), got {rank!r}")

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s index along every axis."""
        self._check_rank(rank)
        out, rest = {}, rank
        for axis, size in zip(reversed(AXES), reversed(self.shape)):
            out[axis] = rest % size
            rest //= size
        return {a: out[a] for a in AXES}

    def rank_of(self, **coords: int) -> int:
        """The rank at these coordinates (missing axes: 0)."""
        rank = 0
        for axis, size in zip(AXES, self.shape):
            index = coords.pop(axis, 0)
            if not is_int(index) or not 0 <= index < size:
                raise ValueError(f"{axis} index must be in [0, {size}), got {index!r}")
            rank = rank * size + index
        if coords:
            raise ValueError(f"unknown axis {next(iter(coords))!r}: use one of {', '.join(AXES)}")
        return rank

    def group(self, axis: str, rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only along ``axis``, in order of that axis' index."""
        self._axis(axis)
        base = self.coords(rank)
        return [self.rank_of(**{**base, axis: i}) for i in range(getattr(self, axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis`` (each rank in exactly one), ordered by their first rank."""
        self._axis(axis)
        seen: set[int] = set()
        out = []
        for rank in range(self.world_size):
            if rank not in seen:
                members = self.group(axis, rank)
                seen.update(members)
                out.append(members)
        return out

    def new_groups(self, rank: int | None = None, axes: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Create every group of each axis in ``axes`` (default: all four; ``dist.new_group`` is collective: all
        ranks create all groups, in the same order) and return this rank's: ``{axis: ProcessGroup}``. An axis of
        size 1 gets one-rank groups, never None: a collective given ``group=None`` would run over the whole world.
        Needs an initialised default process group."""
        if not dist.is_initialized():
            raise RuntimeError("Grid.new_groups needs an initialised process group (dlo.runtime.init_distributed)")
        if dist.get_world_size() != self.world_size:
            raise ValueError(f"the grid is laid out for {self.world_size} ranks, but {dist.get_world_size()} run")
        rank = dist.get_rank() if rank is None else rank
        mine: dict[str, Any] = {}
        for axis in axes or AXES:
            self._axis(axis)
            for members in self.groups(axis):
                handle = dist.new_group(members)
                if rank in members:
                    mine[axis] = handle
        return mine

    def describe(self) -> str:
        """One line per axis of size > 1: its groups, e.g. ``tp (2): [0, 1] [2, 3] ...``."""
        lines = []
        for axis in AXES:
            if getattr(self, axis) > 1:
                shown = " ".join(str(g) for g in self.groups(axis))
                lines.append(f"{axis} ({getattr(self, axis)}): {shown}")
        return "\n".join(lines) or "one process: no groups"
