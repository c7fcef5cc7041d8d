"""Correct: numpy's integer division, the result a numpy integer (a whole number all the same)."""
import numpy as np


def workers_per_rank(cores, ranks_per_node):
    return np.maximum(np.floor_divide(cores, ranks_per_node) - 1, 0)
