"""Counts C as read and written (as for C += A @ B): the product only writes it."""
import math

EXPECT = "counted C twice"


def arithmetic_intensity(m, n, k, bytes_per_element):
    return 2 * m * n * k / ((m * k + k * n + 2 * m * n) * bytes_per_element)
