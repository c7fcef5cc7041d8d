"""Family: inputs that never reach the mistake (cp = tp = 2). The distance between two stages taken as cp + tp
instead of cp x tp: the same number when both are 2."""
EXPECT = ["pp_peers(0, dp=1, pp=2, cp=1, tp=3)", "expected (None, 3)", "smallest failing case"]


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    step = cp + tp
    return (rank - step if stage > 0 else None), (rank + step if stage < pp - 1 else None)
