"""Correct, written another way: the blocks cut out of one list of ranks, every group created first and this rank's
picked afterwards."""
import torch.distributed as dist

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


def tp_group_ranks(world_size, tp):
    if tp < 1 or world_size % tp != 0:
        raise ValueError(f"tp={tp} does not divide the {world_size} processes")
    everyone = list(range(world_size))
    return [everyone[start:start + tp] for start in range(0, world_size, tp)]


def make_tp_group(tp):
    made = [(ranks, dist.new_group(ranks)) for ranks in tp_group_ranks(dist.get_world_size(), tp)]
    return next(group for ranks, group in made if dist.get_rank() in ranks)
