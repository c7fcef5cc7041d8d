"""Layer 4, measure: honest timing (warm-up until steady, repeats, spread), memory and FLOPs calculators,
MFU, the roofline, plots.
"""
