"""Checkers of Jour1/shapes.ipynb (course ``shapes``): arithmetic intensity, the roofline bound, padding."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register

SHAPES_NB = "Jour1/shapes.ipynb"


def _close(got: object, want: float, rel: float = 1e-9) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) <= rel * max(1.0, abs(want))


@register("shapes", "intensity", ("arithmetic_intensity",), SHAPES_NB)
def _check_intensity(arithmetic_intensity: Callable) -> str:
    for m, n, k, b in ((1024, 1024, 1024, 4), (8, 4096, 4096, 2), (4096, 1, 4096, 2), (3, 5, 7, 8)):
        want = 2 * m * n * k / ((m * k + k * n + m * n) * b)
        got = arithmetic_intensity(m, n, k, b)
        if _close(got, 2 * m * n * k / ((m * k + k * n) * b)):
            expect(False, f"({m}, {n}, {k}, {b} bytes): the output C[m, n] is written too: add m*n elements to the bytes")
        expect(not _close(got, m * n * k / ((m * k + k * n + m * n) * b)),
                f"({m}, {n}, {k}, {b} bytes): count 2 FLOPs per term (a multiply and an add): 2*m*n*k")
        expect(not _close(got, 2 * m * n * k / (m * k + k * n + m * n)) or b == 1,
               f"({m}, {n}, {k}, {b} bytes per element): you divided by elements, not bytes: multiply the elements "
               "moved by bytes_per_element")
        expect(_close(got, want), f"({m}, {n}, {k}, {b} bytes per element): expected {want:.4g} FLOP/byte, got {got!r}")
    return "2mnk FLOPs over (mk + kn + mn) elements read or written, times the bytes per element"


@register("shapes", "roofline", ("roofline_bound",), SHAPES_NB)
def _check_roofline(roofline_bound: Callable) -> str:
    peak, bw = 989e12, 3.35e12  # H100 SXM, bf16 (cited figures)
    for intensity in (1.0, 50.0, peak / bw, 300.0, 5000.0):
        want = min(peak, intensity * bw)
        got = roofline_bound(intensity, peak, bw)
        expect(_close(got, want), f"intensity {intensity:.4g} FLOP/B on an H100 (989 TFLOP/s, 3.35 TB/s): "
                                   f"expected min(peak, intensity x bandwidth) = {want:.4g} FLOP/s, got {got!r}")
    return "attainable FLOP/s = min(peak, intensity x bandwidth): memory roof below the knee, compute roof above"


@register("shapes", "padding", ("pad_to_multiple",), SHAPES_NB)
def _check_padding(pad_to_multiple: Callable) -> str:
    for n, k, want in ((50257, 64, 50304), (64, 64, 64), (65, 64, 128), (3, 4, 4), (1, 8, 8), (1000, 8, 1000),
                       (1001, 8, 1008)):
        got = pad_to_multiple(n, k)
        expect(got == want and isinstance(got, int), f"pad_to_multiple({n}, {k}) should be {want} (an int), got {got!r}"
                + (" (a size that is already a multiple stays as it is)" if n % k == 0 else ""))
    return "the smallest multiple of k that is >= n, as an int"
