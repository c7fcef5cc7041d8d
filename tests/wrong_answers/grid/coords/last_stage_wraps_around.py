"""Family: part of the result. The neighbours computed modulo pp, as in a ring: the last stage would send its
output to the first one, which expects token ids, and the first stage would wait for an input from the last."""
EXPECT = "not a ring"


def rank_coords(rank, dp, pp, cp, tp):
    rest, t = divmod(rank, tp)
    rest, c = divmod(rest, cp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "cp": c, "tp": t}


def pp_peers(rank, dp, pp, cp, tp):
    where = rank_coords(rank, dp, pp, cp, tp)
    base = rank - where["pp"] * cp * tp
    if pp == 1:
        return None, None
    return base + (where["pp"] - 1) % pp * cp * tp, base + (where["pp"] + 1) % pp * cp * tp
