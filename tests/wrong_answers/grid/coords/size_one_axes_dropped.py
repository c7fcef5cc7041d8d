"""Family: a flag instead of the behaviour. Only the axes larger than 1 are returned: the result looks right when
printed for the layouts used, but a caller that asks for coords["cp"] fails."""
EXPECT = "missing cp"


def rank_coords(rank, dp, pp, cp, tp):
    out, rest = {}, rank
    for axis, size in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp)):
        rest, index = divmod(rest, size)
        if size > 1:
            out[axis] = index
    return out


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank // (cp * tp) % pp
    return (rank - cp * tp if stage > 0 else None), (rank + cp * tp if stage < pp - 1 else None)
