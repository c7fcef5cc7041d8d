"""Family: inputs that never reach the mistake (cp = 1 or 2). The distance between two stages written with the
context-parallel size of the example, 2, whenever cp is on: right for cp = 1 and cp = 2, wrong for cp = 3."""
EXPECT = ["pp_peers(0, dp=1, pp=2, cp=3, tp=1)", "expected (None, 3)", "smallest failing case"]


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    step = tp * (2 if cp > 1 else 1)
    return (rank - step if stage > 0 else None), (rank + step if stage < pp - 1 else None)
