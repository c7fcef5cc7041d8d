"""Uses the lesson's H100 peak instead of the peak_flops argument."""
import math

EXPECT = "A100"


def roofline_bound(intensity, peak_flops, bandwidth):
    return min(989e12, intensity * bandwidth)
