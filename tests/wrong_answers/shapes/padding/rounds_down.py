"""n // k * k: rounds down, so the padded size can be smaller than n."""
import math

EXPECT = "never down"


def pad_to_multiple(n, k):
    return n // k * k
