"""Family: inputs that never reach the mistake (dp = 1). The stage read as rank // (cp x tp) without reducing it
modulo pp: right for the first replica, wrong for every rank of the second one (its stages count on from pp)."""
EXPECT = ["pp_peers(", "expected", "smallest failing case"]


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage, step = rank // (cp * tp), cp * tp
    return (rank - step if stage > 0 else None), (rank + step if stage < pp - 1 else None)
