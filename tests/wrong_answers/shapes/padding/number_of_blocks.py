"""Returns the ceiling division (n + k - 1) // k: the number of blocks, not the padded size."""
import math

EXPECT = "number of blocks"


def pad_to_multiple(n, k):
    return (n + k - 1) // k
