"""Divides the bandwidth by the intensity: units of bytes per FLOP per second."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "intensity x bandwidth"


def roofline_bound(intensity, peak_flops, bandwidth):
    return min(peak_flops, bandwidth / intensity)
