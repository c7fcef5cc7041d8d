"""Correct: the cores each rank gets taken from divmod, one left to the training process, never below zero."""


def workers_per_rank(cores, ranks_per_node):
    per_rank, _ = divmod(cores, ranks_per_node)
    return per_rank - 1 if per_rank > 0 else 0
