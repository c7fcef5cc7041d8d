"""Correct: the bytes of each operand counted apart, then summed."""


def arithmetic_intensity(m, n, k, bytes_per_element):
    a_bytes = m * k * bytes_per_element
    b_bytes = k * n * bytes_per_element
    c_bytes = m * n * bytes_per_element
    return 2.0 * m * n * k / (a_bytes + b_bytes + c_bytes)
