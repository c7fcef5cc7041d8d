"""Divides with //: the intensity is truncated, and 0 below 1 FLOP/byte."""
import math

EXPECT = "true division"


def arithmetic_intensity(m, n, k, bytes_per_element):
    return 2 * m * n * k // ((m * k + k * n + m * n) * bytes_per_element)
