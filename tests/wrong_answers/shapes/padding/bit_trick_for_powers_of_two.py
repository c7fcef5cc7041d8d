"""Rounds up with the bit trick (n + k - 1) & ~(k - 1), which is right only when k is a power of two."""

EXPECT = "not a multiple"


def pad_to_multiple(n, k):
    return (n + k - 1) & ~(k - 1)
