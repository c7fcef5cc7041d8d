"""Family: inputs that never reach the mistake (cp = tp = 2, or cp = 1). The cp coordinate read as rank // cp % cp
instead of rank // tp % cp: 0 when cp = 1, and the same number when cp equals tp, as on a 2 x 2
context-and-tensor layout."""
EXPECT = ["rank_coords(2, dp=1, pp=1, cp=2, tp=3)", "expected", "smallest failing case"]


def rank_coords(rank, dp, pp, cp, tp):
    rest = rank // (cp * tp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": rank // cp % cp, "tp": rank % tp}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank // (cp * tp) % pp
    return (rank - cp * tp if stage > 0 else None), (rank + cp * tp if stage < pp - 1 else None)
