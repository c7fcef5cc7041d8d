"""Family: inputs that never reach the mistake. The cp axis forgotten (the grid drawn above has none): right on
every layout with cp = 1, wrong as soon as context parallelism is on."""
EXPECT = "cp axis is left out"


def rank_coords(rank, dp, pp, cp, tp):
    return {"dp": rank // (pp * tp), "pp": rank // tp % pp, "cp": 0, "tp": rank % tp}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    return (rank - tp if stage > 0 else None), (rank + tp if stage < pp - 1 else None)
