"""Family: inputs that never reach the mistake (no node with more than 10 cores per rank). Caps the workers at 16
("more never helps"): the budget is what the node allows, and a 256-core node with one rank gets 255."""
EXPECT = "workers per rank, got 16"


def workers_per_rank(cores, ranks_per_node):
    return min(16, max(0, cores // ranks_per_node - 1))
