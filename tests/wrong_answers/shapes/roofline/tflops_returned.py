"""Returns TFLOP/s (divides by 1e12) where the function returns FLOP/s."""
import math

EXPECT = "not TFLOP/s"


def roofline_bound(intensity, peak_flops, bandwidth):
    return min(peak_flops, intensity * bandwidth) / 1e12
