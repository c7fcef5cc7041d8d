"""Keeps one core for the training loop but gives every rank all the other cores of the node."""

EXPECT = "divide the cores"


def workers_per_rank(cores, ranks_per_node):
    return max(0, cores - 1)
