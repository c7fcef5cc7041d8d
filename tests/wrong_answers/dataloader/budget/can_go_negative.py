"""cores // ranks - 1 without a floor: negative with fewer cores than ranks."""
import time

EXPECT = 'workers per rank'


def workers_per_rank(cores, ranks_per_node):
    return cores // ranks_per_node - 1
