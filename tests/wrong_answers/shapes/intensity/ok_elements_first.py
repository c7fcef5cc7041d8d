"""Correct: the number of elements moved counted first, then FLOPs per byte as a ratio of floats."""


def arithmetic_intensity(m, n, k, bytes_per_element):
    elements = m * k + k * n + m * n
    return float(2 * m * n * k) / float(elements * bytes_per_element)
