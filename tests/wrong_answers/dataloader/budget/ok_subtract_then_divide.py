"""Correct: the ranks' own cores removed first, then the rest divided (the same number, written another way)."""


def workers_per_rank(cores, ranks_per_node):
    spare = cores - ranks_per_node
    return max(spare // ranks_per_node, 0)
