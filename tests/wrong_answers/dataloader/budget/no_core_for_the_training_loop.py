"""Gives every core to the workers: the rank's own process then fights them for a core."""
import time

EXPECT = 'workers per rank'


def workers_per_rank(cores, ranks_per_node):
    return cores // ranks_per_node
