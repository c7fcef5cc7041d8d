"""Family: part of the result. The axes nested the other way round (tp outermost, dp innermost): right on a layout
where only one axis is larger than 1, wrong as soon as two are."""
EXPECT = ["nested", "tp innermost"]


def rank_coords(rank, dp, pp, cp, tp):
    out, rest = {}, rank
    for axis, size in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        rest, out[axis] = divmod(rest, size)
    return out


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    return (rank - dp if stage > 0 else None), (rank + dp if stage < pp - 1 else None)
