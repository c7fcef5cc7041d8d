"""Correct: the memory roof computed first and capped by the compute roof through sorted()."""


def roofline_bound(intensity, peak_flops, bandwidth):
    memory_roof = intensity * bandwidth
    return sorted((memory_roof, peak_flops))[0]
