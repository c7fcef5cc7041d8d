"""round(n / k) * k: the nearest multiple, which is below n about half of the time."""
import math

EXPECT = "never down"


def pad_to_multiple(n, k):
    return round(n / k) * k
