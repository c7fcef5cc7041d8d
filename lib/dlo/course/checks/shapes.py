"""Checkers of Jour1/shapes.ipynb (course ``shapes``): arithmetic intensity, the roofline bound, padding."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register

SHAPES_NB = "Jour1/shapes.ipynb"


def _close(got: object, want: float, rel: float = 1e-9) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) <= rel * max(1.0, abs(want))


@register("shapes", "intensity", ("arithmetic_intensity",), SHAPES_NB)
def _check_intensity(arithmetic_intensity: Callable) -> str:
    for m, n, k, b in ((1024, 1024, 1024, 4), (3, 5, 7, 8), (8, 4096, 4096, 2), (4096, 1, 4096, 2)):
        want = 2 * m * n * k / ((m * k + k * n + m * n) * b)
        got = arithmetic_intensity(m, n, k, b)
        if _close(got, 2 * m * n * k / ((m * k + k * n) * b)):
            expect(False, f"({m}, {n}, {k}, {b} bytes): the output C[m, n] is written too: add m*n elements to the "
                          "bytes")
        expect(not _close(got, 2 * m * n * k / ((m * k + k * n + m * n) * 4)) or b == 4,
               f"({m}, {n}, {k}, {b} bytes per element): you counted 4 bytes per element (fp32) whatever the dtype: "
               "use the bytes_per_element argument")
        expect(not _close(got, m * n * k / ((m * k + k * n + m * n) * b)),
                f"({m}, {n}, {k}, {b} bytes): count 2 FLOPs per term (a multiply and an add): 2*m*n*k")
        expect(not _close(got, 2 * m * n * k / (m * k + k * n + m * n)) or b == 1,
               f"({m}, {n}, {k}, {b} bytes per element): you divided by elements, not bytes: multiply the elements "
               "moved by bytes_per_element")
        expect(not _close(got, 2 * m * n * k / ((m * k + k * n + 2 * m * n) * b)),
               f"({m}, {n}, {k}, {b} bytes): you counted C twice (read and written): the product only writes C, "
               "so count its m*n elements once")
        expect(not (isinstance(got, int) and got == int(want) and got != want),
               f"({m}, {n}, {k}, {b} bytes): use true division /, not //: the intensity is a real number "
               f"({want:.4g} here), // truncates it (to 0 below 1 FLOP/byte)")
        expect(_close(got, want), f"({m}, {n}, {k}, {b} bytes per element): expected {want:.4g} FLOP/byte, got {got!r}")
    return "2mnk FLOPs over (mk + kn + mn) elements read or written, times the bytes per element"


@register("shapes", "roofline", ("roofline_bound",), SHAPES_NB)
def _check_roofline(roofline_bound: Callable) -> str:
    # two GPUs (cited figures, bf16): the peak and the bandwidth are arguments, never the lesson's numbers
    for name, peak, bw in (("an H100 (989 TFLOP/s, 3.35 TB/s)", 989e12, 3.35e12),
                           ("an A100 (312 TFLOP/s, 2.04 TB/s)", 312e12, 2.039e12)):
        knee = peak / bw
        for intensity in (1.0, 50.0, knee, 300.0, 5000.0, 0.7 * knee, 1.3 * knee):
            want = min(peak, intensity * bw)
            got = roofline_bound(intensity, peak, bw)
            where = f"intensity {intensity:.4g} FLOP/B on {name}"
            expect(not _close(got, want / 1e12), f"{where}: return FLOP/s, not TFLOP/s (got {got!r})")
            h100 = (min(989e12, intensity * bw), min(peak, intensity * 3.35e12), min(989e12, intensity * 3.35e12))
            expect(peak == 989e12 or _close(got, want) or not any(_close(got, v) for v in h100),
                   f"{where}: use the peak_flops and bandwidth arguments, not the H100's figures: expected "
                   f"{want:.4g} FLOP/s, got {got!r}")
            expect(not (_close(got, intensity * bw) and intensity > knee * 1.01),
                   f"{where}: above the knee ({knee:.0f} FLOP/B) the compute peak caps the bound: min(peak, intensity "
                   f"x bandwidth) = {want:.4g} FLOP/s, got {got!r}")
            expect(not (_close(got, peak) and intensity < knee * 0.99),
                   f"{where}: below the knee ({knee:.0f} FLOP/B) memory limits the kernel: min(peak, intensity x "
                   f"bandwidth) = {want:.4g} FLOP/s, got {got!r}")
            expect(_close(got, want), f"{where}: expected min(peak, intensity x bandwidth) = {want:.4g} FLOP/s, got "
                                      f"{got!r}")
    return "attainable FLOP/s = min(peak, intensity x bandwidth): memory roof below the knee, compute roof above"


@register("shapes", "padding", ("pad_to_multiple",), SHAPES_NB)
def _check_padding(pad_to_multiple: Callable) -> str:
    for n, k, want in ((50257, 64, 50304), (64, 64, 64), (65, 64, 128), (3, 4, 4), (1, 8, 8), (1000, 8, 1000),
                       (1001, 8, 1008), (37, 12, 48), (10**17 + 1, 8, 10**17 + 8)):
        got = pad_to_multiple(n, k)
        if isinstance(got, int) and got != want:
            expect(got != -(-n // k), f"pad_to_multiple({n}, {k}) = {got} is the number of blocks of {k}: multiply "
                                      f"it by k to get the padded size {want}")
            expect(got >= n, f"pad_to_multiple({n}, {k}) = {got} is smaller than {n}: round up to {want}, never down")
            expect(got % k != 0 or got < want or n % k == 0,
                   f"pad_to_multiple({n}, {k}) = {got} is a multiple of {k}, but not the smallest that is >= {n}: "
                   f"expected {want}")
        expect(got == want and isinstance(got, int), f"pad_to_multiple({n}, {k}) should be {want} (an int), got {got!r}"
                + (" (a size that is already a multiple stays as it is)" if n % k == 0 else ""))
    return "the smallest multiple of k that is >= n, as an int"
