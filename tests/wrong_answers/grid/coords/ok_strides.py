"""Correct, written another way: each axis's stride (the product of the sizes inside it), the coordinate as
rank // stride % size, and the neighbours one pp stride away while the stage stays in 0 .. pp - 1."""


def _strides(dp, pp, cp, tp):
    return {"dp": pp * cp * tp, "pp": cp * tp, "cp": tp, "tp": 1}


def rank_coords(rank, dp, pp, cp, tp):
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    return {axis: rank // stride % sizes[axis] for axis, stride in _strides(dp, pp, cp, tp).items()}


def pp_peers(rank, dp, pp, cp, tp):
    stride = _strides(dp, pp, cp, tp)["pp"]
    stage = rank // stride % pp
    return (rank - stride if stage - 1 >= 0 else None, rank + stride if stage + 1 <= pp - 1 else None)
