"""Pads to the next power of two: a multiple of k, but far from the smallest one."""
import math

EXPECT = "not a multiple of 3"


def pad_to_multiple(n, k):
    return max(k, 1 << (n - 1).bit_length())
