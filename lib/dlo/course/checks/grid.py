"""Checker of tp_pipeline/grid.ipynb's exercise (``dlo check grid coords``): where a rank sits in the
``dp × pp × cp × tp`` grid, and which ranks hold its previous and next pipeline stage.

Both functions are compared with :class:`dlo.runtime.grid.Grid` (itself tested against
``torch.arange(world).view(...)`` and torch's DeviceMesh) on every rank of the layouts of :func:`layouts`: every
pair of axes at sizes 2 and 3 (the others at 1), every order of the sizes 1, 2, 3, 4 (all distinct: cp != tp, each
axis at 1), and layouts of 2, 3, 4, 5 with no axis at 1. They are tried smallest world first and the first difference
is reported, so the message shows the smallest failing case. One process, no group: the answer is arithmetic. A
wrong answer is named when it is a known mistake (axes nested in another order, cp forgotten, previous and next
swapped, a pipeline wrapped into a ring, neighbours one rank apart), otherwise the rank is shown with both answers.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.runtime.grid import AXES, Grid

NOTEBOOK = "tp_pipeline/grid.ipynb"

def layouts() -> list[tuple[int, int, int, int]]:
    """Every layout the check tries, smallest world first (the first failing one is the smallest that shows a
    mistake): each pair of axes at sizes 2 and 3 with the others at 1 (both ways round), all 24 orders of the sizes
    1, 2, 3, 4 (all distinct, each axis at 1 once per other order), four layouts of the sizes 2, 3, 4, 5 (each axis at
    each size once: no axis at 1 to hide an order), a pure pipeline and one rank. Enumerated rather than sampled: a
    mistake that depends on two sizes differing, or on an axis being larger than 1, is reached by construction."""
    out = {(1, 1, 1, 1), (1, 8, 1, 1)}
    for i, j in itertools.permutations(range(4), 2):
        shape = [1, 1, 1, 1]
        shape[i], shape[j] = 2, 3
        out.add(tuple(shape))
    out.update(itertools.permutations((1, 2, 3, 4)))
    out.update(tuple((2, 3, 4, 5)[(k + a) % 4] for a in range(4)) for k in range(4))
    return sorted(out, key=lambda shape: (_product(shape), shape))


def _product(shape: tuple[int, ...]) -> int:
    out = 1
    for size in shape:
        out *= size
    return out


def _coords_in_order(rank: int, sizes: dict[str, int], order: tuple[str, ...], wrap: bool = True) -> dict[str, int]:
    """The coordinates of ``rank`` if the axes were nested in ``order`` (outermost first); ``wrap=False``: the
    outermost one not reduced modulo its size (what ``rank // (...)`` gives)."""
    out, rest = {}, rank
    for axis in reversed(order):
        out[axis] = rest % sizes[axis] if wrap or axis != order[0] else rest
        rest //= sizes[axis]
    return out


def _nested(order: tuple[str, ...], skip: str = "", cp_one: bool = False) -> Callable:
    """A known mistake of rank_coords: the axes nested in ``order``; ``cp_one``: the cp axis left out (taken as 1)
    and its coordinate ``skip``ped in the comparison."""
    def matches(got: dict[str, int], rank: int, sizes: dict[str, int]) -> bool:
        use = {**sizes, "cp": 1} if cp_one else sizes
        keep = [a for a in AXES if a != skip]
        return any({a: got[a] for a in keep} == {a: c[a] for a in keep}
                   for c in (_coords_in_order(rank, use, order), _coords_in_order(rank, use, order, wrap=False)))
    return matches


#: (does an answer match this mistake on one rank, what to say): named only when it matches on every rank tried
COORDS_MISTAKES = [(_nested(AXES, "cp", cp_one=True),
                    "the cp axis is left out of the layout -- it sits between pp and tp, so every rank further out "
                    "(pp, dp) is cp times further apart")]
COORDS_MISTAKES += [(_nested(order), f"those are the coordinates of a grid nested {' × '.join(order)} (outermost "
                                     f"first); this grid nests {' × '.join(AXES)} -- tp innermost, so that consecutive "
                                     "ranks (one node) share a TP group, dp outermost")
                    for order in itertools.permutations(AXES) if order != AXES]


def _neighbours(rank: int, sizes: dict[str, int]) -> tuple[list[int], int]:
    stages = Grid(_product(tuple(sizes.values())), **sizes).group("pp", rank)
    return stages, stages.index(rank)


def _apart(d: Callable[[dict[str, int]], int]) -> Callable:
    def matches(got: tuple, rank: int, sizes: dict[str, int]) -> bool:
        stages, i = _neighbours(rank, sizes)
        step, world = d(sizes), _product(tuple(sizes.values()))
        by_stage = (rank - step if i > 0 else None, rank + step if i < len(stages) - 1 else None)
        by_world = tuple(rank + x if 0 <= rank + x < world else None for x in (-step, step))
        return got in (by_stage, by_world)
    return matches


def _ring(got: tuple, rank: int, sizes: dict[str, int]) -> bool:
    stages, i = _neighbours(rank, sizes)
    if len(stages) == 1:
        return got in ((None, None), (rank, rank))
    return got == (stages[i - 1], stages[(i + 1) % len(stages)])


def _swapped(got: tuple, rank: int, sizes: dict[str, int]) -> bool:
    return got == _want_peers(rank, sizes)[::-1]


PEERS_MISTAKES = [
    (_swapped, "previous and next are swapped -- the previous stage sends this one its activations, the next one "
               "receives them"),
    (_ring, "a pipeline is not a ring -- the first stage has no previous stage and the last no next one (None)"),
    (_apart(lambda s: 1), "the neighbouring stages are taken one rank apart, but two ranks that differ only by their "
                          "pp coordinate are cp × tp ranks apart"),
    (_apart(lambda s: s["tp"]), "the neighbouring stages are taken tp ranks apart (cp forgotten), but two ranks that "
                                "differ only by their pp coordinate are cp × tp ranks apart"),
    (_apart(lambda s: s["cp"]), "the neighbouring stages are taken cp ranks apart (tp forgotten), but two ranks that "
                                "differ only by their pp coordinate are cp × tp ranks apart"),
]


def _want_peers(rank: int, sizes: dict[str, int]) -> tuple:
    stages, i = _neighbours(rank, sizes)
    return (stages[i - 1] if i > 0 else None, stages[i + 1] if i < len(stages) - 1 else None)


def _where(name: str, rank: int, sizes: dict[str, int]) -> str:
    return f"{name}({rank}, " + ", ".join(f"{a}={sizes[a]}" for a in AXES) + ")"


def _answers(fn: Callable, name: str, tried: list[tuple[int, ...]]) -> list[tuple[dict[str, int], int, Any]]:
    """The answer on every rank of every layout, smallest first; the first error raised stops the check."""
    out = []
    for shape in tried:
        sizes = dict(zip(AXES, shape))
        for rank in range(_product(shape)):
            try:
                out.append((sizes, rank, fn(rank, **sizes)))
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - the student's error, in one line
                raise CheckFailed(f"{_where(name, rank, sizes)} raised {type(exc).__name__}: {exc} (the smallest "
                                  "failing case)") from None
    return out


def _coords_shape_problem(got: Any, where: str) -> str | None:
    if not isinstance(got, dict):
        return f"{where} returned {got!r}: return a dict {{'dp': ..., 'pp': ..., 'cp': ..., 'tp': ...}}"
    if set(got) != set(AXES):
        missing = sorted(set(AXES) - set(got))
        return (f"{where} returned the keys {sorted(got)}: one coordinate per axis of the grid, "
                f"{', '.join(AXES)}" + (f" (missing {', '.join(missing)}: an axis of size 1 still has its "
                                        "coordinate, 0)" if missing else ""))
    return None


def _first_difference(answers: list, name: str, want: Callable, shape_problem: Callable, normal: Callable,
                      mistakes: list) -> str | None:
    """The smallest failing case, with the mistake named when a known one matches the answer on every rank tried."""
    for sizes, rank, got in answers:
        where = _where(name, rank, sizes)
        problem = shape_problem(got, where)
        if problem:
            return f"{problem} (the smallest failing case)"
        expected = want(rank, sizes)
        if normal(got) == expected:
            continue
        every = [(normal(g), r, s) for s, r, g in answers if shape_problem(g, "") is None]
        named = [why for matches, why in mistakes
                 if len(every) == len(answers) and all(matches(g, r, s) for g, r, s in every)]
        return (f"{where} gave {normal(got)}, expected {expected}" + (f": {named[0]}" if named else "")
                + " (the smallest failing case)")
    return None


def _peers_shape_problem(got: Any, where: str) -> str | None:
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"{where} returned {got!r}: return a pair (previous, next), None where there is no such stage"
    return None


@register("grid", "coords", ("rank_coords", "pp_peers"), NOTEBOOK)
def _check_coords(rank_coords: Callable, pp_peers: Callable) -> str:
    tried = layouts()
    problem = _first_difference(
        _answers(rank_coords, "rank_coords", tried), "rank_coords",
        lambda rank, sizes: Grid(_product(tuple(sizes.values())), **sizes).coords(rank), _coords_shape_problem,
        lambda got: {a: int(v) for a, v in got.items()}, COORDS_MISTAKES)
    expect(problem is None, problem or "")
    problem = _first_difference(_answers(pp_peers, "pp_peers", tried), "pp_peers", _want_peers, _peers_shape_problem,
                                tuple, PEERS_MISTAKES)
    expect(problem is None, problem or "")
    return (f"coordinates and pipeline neighbours of every rank equal dlo.runtime.grid.Grid's on {len(tried)} "
            "layouts, smallest first: every pair of axes at 2 and 3, every order of the sizes 1, 2, 3, 4, four of "
            "2, 3, 4, 5")
