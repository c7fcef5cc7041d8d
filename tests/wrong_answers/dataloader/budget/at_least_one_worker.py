"""Never goes below one worker: with no core to spare, 0 workers (loading in the main process) is the answer."""

EXPECT = "0 workers per rank"


def workers_per_rank(cores, ranks_per_node):
    return max(1, cores // ranks_per_node - 1)
