"""Multiplies the elements by 4 bytes (fp32) instead of the bytes_per_element argument."""
import math

EXPECT = "4 bytes per element"


def arithmetic_intensity(m, n, k, bytes_per_element):
    return 2 * m * n * k / ((m * k + k * n + m * n) * 4)
