"""Returns intensity x bandwidth: forgets that compute caps the bound above the knee."""
import math

EXPECT = "compute peak caps"


def roofline_bound(intensity, peak_flops, bandwidth):
    return intensity * bandwidth
