"""Checker of tp_pipeline/grid.ipynb's exercise (``dlo check grid coords``): where a rank sits in the
``dp × pp × cp × tp`` grid, and which ranks hold its previous and next pipeline stage.

Both functions are compared with :class:`dlo.runtime.grid.Grid` (itself tested against
``torch.arange(world).view(...)`` and torch's DeviceMesh) on every rank of several layouts chosen so that the
usual mistakes show: odd world sizes (12, 18, 24), axes of size 1 that hide a wrong order (8 = 1 × 8 × 1 × 1),
and a context-parallel axis of 2 (a layout that forgets cp still passes every layout without one). One process,
no group: the answer is arithmetic. A wrong answer is named when it is a known mistake (axes nested in another
order, cp forgotten, previous and next swapped, a pipeline wrapped into a ring, neighbours one rank apart),
otherwise the first rank that differs is shown with both answers.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.runtime.grid import AXES, Grid

NOTEBOOK = "tp_pipeline/grid.ipynb"

#: (dp, pp, cp, tp): odd sizes, size-1 axes, a cp axis; tp and pp of different sizes so that swapping them shows.
LAYOUTS = ((3, 2, 1, 2), (2, 3, 1, 3), (3, 3, 1, 2), (1, 8, 1, 1), (2, 2, 1, 2), (1, 2, 2, 2), (2, 3, 2, 2))


def _coords_in_order(rank: int, sizes: dict[str, int], order: tuple[str, ...]) -> dict[str, int]:
    """The coordinates of ``rank`` if the axes were nested in ``order`` (outermost first)."""
    out, rest = {}, rank
    for axis in reversed(order):
        out[axis] = rest % sizes[axis]
        rest //= sizes[axis]
    return out


def _call(fn: Callable, rank: int, sizes: dict[str, int], name: str) -> Any:
    where = f"{name}({rank}, " + ", ".join(f"{a}={sizes[a]}" for a in AXES) + ")"
    try:
        return fn(rank, **sizes), where
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the student's error, in one line
        raise CheckFailed(f"{where} raised {type(exc).__name__}: {exc}") from None


def _coords_problem(got: Any, want: dict[str, int], rank: int, sizes: dict[str, int], where: str) -> str | None:
    if not isinstance(got, dict):
        return f"{where} returned {got!r}: return a dict {{'dp': ..., 'pp': ..., 'cp': ..., 'tp': ...}}"
    if set(got) != set(AXES):
        missing = sorted(set(AXES) - set(got))
        return (f"{where} returned the keys {sorted(got)}: one coordinate per axis of the grid, "
                f"{', '.join(AXES)}" + (f" (missing {', '.join(missing)}: an axis of size 1 still has its "
                                        "coordinate, 0)" if missing else ""))
    got = {a: int(v) for a, v in got.items()}
    if got == want:
        return None
    if sizes["cp"] > 1 and got == _coords_in_order(rank, {**sizes, "cp": 1}, AXES) | {"cp": got["cp"]}:
        return (f"{where} gave {got}, expected {want}: the cp axis is left out of the layout -- it sits between pp "
                "and tp, so every rank further out (pp, dp) is cp times further apart")
    for order in (AXES[::-1], *itertools.permutations(AXES)):  # the whole order reversed first: the usual mistake
        if order != AXES and _coords_in_order(rank, sizes, order) == got:
            return (f"{where} gave {got}, expected {want}: those are the coordinates of a grid nested "
                    f"{' × '.join(order)} (outermost first); this grid nests {' × '.join(AXES)} -- tp innermost, so "
                    "that consecutive ranks (one node) share a TP group, dp outermost")
    return f"{where} gave {got}, expected {want}"


def _peers_problem(got: Any, want: tuple, rank: int, sizes: dict[str, int], where: str) -> str | None:
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"{where} returned {got!r}: return a pair (previous, next), None where there is no such stage"
    if tuple(got) == want:
        return None
    grid = Grid(**{"world_size": _world(sizes)}, **sizes)
    stages = grid.group("pp", rank)
    stage = stages.index(rank)
    step = sizes["cp"] * sizes["tp"]
    if tuple(got) == want[::-1]:
        return (f"{where} gave {got}, expected {want}: previous and next are swapped -- the previous stage sends "
                "this one its activations, the next one receives them")
    if (stage == 0 and got[0] == stages[-1]) or (stage == len(stages) - 1 and got[1] == stages[0]):
        return (f"{where} gave {got}, expected {want}: a pipeline is not a ring -- the first stage has no previous "
                "stage and the last no next one (None)")
    for wrong, words in ((1, "one rank apart"), (sizes["tp"], "tp ranks apart (cp forgotten)"),
                         (sizes["cp"], "cp ranks apart (tp forgotten)")):
        guess = tuple(None if not 0 <= rank + d < grid.world_size else rank + d for d in (-wrong, wrong))
        if wrong != step and tuple(got) == guess:
            return (f"{where} gave {got}, expected {want}: the neighbouring stages are {words} here, but two ranks "
                    f"that differ only by their pp coordinate are cp × tp = {step} ranks apart")
    return f"{where} gave {got}, expected {want} (the ranks with the same dp, cp and tp on the stages around it)"


def _world(sizes: dict[str, int]) -> int:
    out = 1
    for a in AXES:
        out *= sizes[a]
    return out


@register("grid", "coords", ("rank_coords", "pp_peers"), NOTEBOOK)
def _check_coords(rank_coords: Callable, pp_peers: Callable) -> str:
    for shape in LAYOUTS:
        sizes = dict(zip(AXES, shape))
        grid = Grid(_world(sizes), **sizes)
        for rank in range(grid.world_size):
            got, where = _call(rank_coords, rank, sizes, "rank_coords")
            problem = _coords_problem(got, grid.coords(rank), rank, sizes, where)
            expect(problem is None, problem or "")
        for rank in range(grid.world_size):
            stages = grid.group("pp", rank)
            i = stages.index(rank)
            want = (stages[i - 1] if i > 0 else None, stages[i + 1] if i < len(stages) - 1 else None)
            got, where = _call(pp_peers, rank, sizes, "pp_peers")
            problem = _peers_problem(got, want, rank, sizes, where)
            expect(problem is None, problem or "")
    return (f"coordinates and pipeline neighbours of every rank equal dlo.runtime.grid.Grid's on {len(LAYOUTS)} "
            "layouts (12, 18, 8 and 24 ranks, size-1 axes, a cp axis)")
