"""Branches on the H100's knee (989 / 3.35, about 295 FLOP/B) whatever the device: on a GPU whose knee is lower
(an A100's is about 153 FLOP/B) a kernel between the two is given more than the peak."""

EXPECT = ["A100", "compute roof"]


def roofline_bound(intensity, peak_flops, bandwidth):
    if intensity < 989 / 3.35:
        return intensity * bandwidth
    return peak_flops
