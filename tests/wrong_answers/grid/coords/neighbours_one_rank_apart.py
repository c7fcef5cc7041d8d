"""Family: inputs that never reach the mistake. The next stage taken as the next rank: right when cp = tp = 1 (a
pure pipeline, 8 = 1 x 8 x 1 x 1), wrong as soon as a stage is split."""
EXPECT = "one rank apart"


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    return (rank - 1 if stage > 0 else None), (rank + 1 if stage < pp - 1 else None)
