"""Counts the bytes of A and B only: the product also writes C."""
import math

EXPECT = "output C[m, n] is written too"


def arithmetic_intensity(m, n, k, bytes_per_element):
    return 2 * m * n * k / ((m * k + k * n) * bytes_per_element)
