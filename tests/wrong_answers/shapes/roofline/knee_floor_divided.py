"""Branches on the knee, but computes it with floor division: between the whole number and the true knee the
bound jumps to the peak too early."""

EXPECT = ["just below the knee", "memory roof"]


def roofline_bound(intensity, peak_flops, bandwidth):
    knee = peak_flops // bandwidth
    if intensity <= knee:
        return intensity * bandwidth
    return peak_flops
