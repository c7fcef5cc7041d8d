"""cores / ranks_per_node - 1 with /: a float, and half a worker when the cores do not divide evenly."""

EXPECT = "integer division"


def workers_per_rank(cores, ranks_per_node):
    return max(0, cores / ranks_per_node - 1)
