"""Family: part of the result. The right two neighbours, returned in the wrong order."""
EXPECT = "swapped"


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage, step = rank_coords(rank, dp, pp, cp, tp)["pp"], cp * tp
    return (rank + step if stage < pp - 1 else None), (rank - step if stage > 0 else None)
