"""Correct: compares the intensity with the knee (peak / bandwidth) instead of taking a min."""


def roofline_bound(intensity, peak_flops, bandwidth):
    knee = peak_flops / bandwidth
    if intensity >= knee:
        return peak_flops
    return intensity * bandwidth
