"""Keeps one core for the whole node, then divides: each rank's own training loop needs its core."""

EXPECT = "one core per rank"


def workers_per_rank(cores, ranks_per_node):
    return max(0, (cores - 1) // ranks_per_node)
