"""Family: inputs that never reach the mistake. pp taken as the outermost axis and dp inside it: identical whenever
dp or pp is 1 (every pipeline-only or data-only layout), wrong on 12 = 3 x 2 x 2."""
EXPECT = "nested pp × dp × cp × tp"


def rank_coords(rank, dp, pp, cp, tp):
    t, rest = rank % tp, rank // tp
    c, rest = rest % cp, rest // cp
    d, p = rest % dp, rest // dp
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    stage = rank_coords(rank, dp, pp, cp, tp)["pp"]
    step = dp * cp * tp
    return (rank - step if stage > 0 else None), (rank + step if stage < pp - 1 else None)
