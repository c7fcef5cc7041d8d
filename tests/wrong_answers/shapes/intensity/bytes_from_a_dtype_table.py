"""Reads the bytes per element through a table of the float dtypes (2, 4, 8 bytes), with fp32's 4 bytes for
anything else: a 1-byte dtype (int8) is silently counted as 4 bytes."""

EXPECT = ["1 byte per element", "expected"]

_BYTES = {2: 2, 4: 4, 8: 8}


def arithmetic_intensity(m, n, k, bytes_per_element):
    size = _BYTES.get(bytes_per_element, 4)
    return 2 * m * n * k / ((m * k + k * n + m * n) * size)
