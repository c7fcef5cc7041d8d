"""The generated cases of the tp checkers: on which group, in which dtype, with which sizes each balise is tried.

The 4 gloo processes hold four settings, in this order (the first one is where a collective that ignores its group
shows as a wrong number, safely, since every process takes part):

- tp = 2 on a STRIDED TP group of a 2 x 2 TP x DP layout: TP groups {0, 2} {1, 3}, DP groups {0, 1} {2, 3} (so
  the rank in the group is not the rank in the world, nor the world rank modulo tp);
- tp = 4 on an explicit group of the 4 processes;
- tp = 3 on the subset {0, 2, 3} (rank 1 is meanwhile alone in its own group: it runs the same case at tp = 1, so
  that every process makes the same calls of the collective ``expect``);
- tp = 1 on a group of one process each.

The sizes are drawn by a small seeded generator of ours rather than Hypothesis: every process must draw the SAME
case without talking to the others (a shrinking search would diverge between processes), and a case must be a pure
function of (tp, seed) so that a failure names a case that can be read back. The sizes drawn are all different
from one another (hidden, intermediate, vocabulary, their slices, num_heads * head_dim), so that a mistake that
takes one for another changes a shape or a number.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Setting:
    """This process's view of one group: its size, the group object, this process's rank in it, and words."""

    tp: int
    group: Any
    r: int
    label: str


def settings(rank: int, groups: dict) -> list[Setting]:
    """The four settings of this process (see the module docstring), built from the worker's groups."""
    tp2 = Setting(2, groups["tp_group"], groups["tp_rank"],
                  f"tp=2 on the strided TP group {groups['tp_members']} of a 2 x 2 TP x DP layout (rank "
                  f"{groups['tp_rank']} in it)")
    tp4 = Setting(4, groups["tp4_group"], rank, f"tp=4 on an explicit group of the 4 processes (rank {rank})")
    solo = Setting(1, groups["tp1_group"], 0, f"tp=1 on a group of one process (process {rank})")
    tp3 = (Setting(3, groups["tp3_group"], groups["tp3_rank"],
                   f"tp=3 on the group [0, 2, 3] (rank {groups['tp3_rank']} in it)")
           if groups["tp3_group"] is not None else solo)
    return [tp2, tp4, tp3, solo]


def plan(sets: list[Setting]) -> list[tuple[Setting, torch.dtype, int]]:
    """(setting, dtype, seed) of the layer cases: tp = 2 in both dtypes, then tp = 4, 3 and 1, several seeds."""
    tp2, tp4, tp3, solo = sets
    return [(tp2, torch.float32, 1), (tp2, torch.float64, 2), (tp4, torch.float64, 3), (tp3, torch.float32, 4),
            (solo, torch.float64, 5)]


def _distinct(values: list[int]) -> bool:
    return len(set(values)) == len(values)


def sizes(tp: int, seed: int) -> dict[str, int]:
    """Layer sizes for ``tp``: ``hidden`` (not split), ``ffn`` and ``vocab`` (multiples of tp), ``out`` and ``inp``
    of a linear layer, all different from one another and from their slices."""
    rng = random.Random(1000 * seed + tp)
    while True:
        per = rng.sample(range(2, 8), 3)
        ffn, vocab, wide = (tp * k for k in per)
        hidden = rng.choice([v for v in range(5, 16) if v % 2])  # odd: never a multiple of tp 2 or 4
        values = [hidden, ffn, vocab, wide] + ([] if tp == 1 else per)
        if _distinct(values):
            return {"hidden": hidden, "ffn": ffn, "vocab": vocab, "wide": wide}


def attention_shape(tp: int, seed: int, hidden: int) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim): K/V heads a multiple of tp (several per rank when seed is even), two or
    three query heads per K/V head, and num_heads * head_dim != hidden."""
    rng = random.Random(2000 * seed + tp)
    kv = tp * (2 if seed % 2 == 0 else rng.choice((1, 2)))
    heads = kv * rng.choice((2, 3))
    head_dim = rng.choice([d for d in (2, 4, 6) if heads * d != hidden])
    return heads, kv, head_dim


def ids_for(vocab: int, tp: int, seed: int) -> torch.Tensor:
    """Token ids [2, 7] that hold 0, vocab - 1 and both sides of every boundary between the ranks' slices."""
    n = vocab // tp
    edges = [0, vocab - 1] + [v for k in range(1, tp) for v in (k * n - 1, k * n)]
    gen = torch.Generator().manual_seed(seed)
    rest = torch.randint(0, vocab, (14 - len(edges),), generator=gen).tolist()
    return torch.tensor(edges + rest).reshape(2, 7)
