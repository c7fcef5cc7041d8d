"""Checkers of Jour1/shapes.ipynb (course ``shapes``): arithmetic intensity, the roofline bound, padding.

Each step runs the student's function and the library's (:mod:`dlo.measure.roofline`) on seeded cases
(:mod:`.cases`): matmul shapes with m, n, k all different, each at 1, odd and power-of-two sizes, 1, 2, 4 and 8 bytes
per element, and square shapes just below and just above the ridge point of several GPUs of the reference table;
roofline bounds on several GPUs and precisions at, just below and just above each knee, far from it and at 0; padding
on every side of a multiple (n = qk - 1, qk, qk + 1), k not a power of two, k = 1, n = 1, n < k and n beyond float
precision. The values are Python numbers: there are no gradients to compare. A known mistake is named only when its
formula gives the student's output on every case (:func:`.cases.judge`), otherwise the message is the case and the
difference.
"""
from __future__ import annotations

import math
import numbers
import random
from typing import Any, Callable

from dlo.course.checks.cases import Case, compare, judge, seeded
from dlo.course.checks.framework import register
from dlo.measure import roofline as lib
from dlo.measure.flops import GPU_PEAKS

SHAPES_NB = "Jour1/shapes.ipynb"

#: Python floats are float64: a formula that is right gives the library's value to a few ulps.
_REL = 1e-9


def _number(got: Any, want: float, what: str) -> str | None:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"{what} is {got!r} ({type(got).__name__}), expected a number close to {want:.6g}"
    if abs(float(got) - want) <= _REL * max(1.0, abs(want)):
        return None
    return f"{what} is {float(got):.6g}, expected {want:.6g}"


# ------------------------------------------------------------------------------------------------ intensity

#: (GPU of the reference table, precision, bytes per element): the square matmuls on either side of their ridges.
_RIDGES = (("H100", "bf16", 2), ("A100", "bf16", 2), ("V100", "fp16", 2), ("L40S", "bf16", 2), ("A100", "fp32", 4),
           ("H100", "tf32", 4))
_SIDES = (1, 2, 3, 7, 8, 63, 64, 65, 127, 1000, 1023, 4096, 4097, 50257, 10 ** 5)


def _mm(m: int, n: int, k: int, b: int, note: str = "") -> Case:
    unit = "byte" if b == 1 else "bytes"
    return Case(f"m={m}, n={n}, k={k}, {b} {unit} per element{note}",
                {"m": m, "n": n, "k": k, "bytes_per_element": b}, size=m * n * k)


def _ridge_cases() -> list[Case]:
    out = []
    for gpu, precision, b in _RIDGES:
        peak, bw = lib.spec_roofline(gpu, precision)
        knee = peak / bw
        star = 3 * b * knee / 2  # a square n x n x n product has intensity 2n / (3b)
        for side, where in ((math.floor(star), "below"), (math.floor(star) + 1, "above")):
            out.append(_mm(side, side, side, b, f" (just {where} the {gpu}'s {precision} ridge, {knee:.0f} FLOP/B)"))
    return out


def _draw_matmul(rng: random.Random) -> Case:
    m, n, k = rng.sample(_SIDES, 3)
    return _mm(m, n, k, rng.choice((1, 2, 4, 8)))


INTENSITY_CASES = seeded(_draw_matmul, 24, seed=1, fixed=[
    _mm(1, 1, 1, 1), _mm(1, 1, 1, 8), _mm(3, 5, 7, 8), _mm(3, 5, 7, 1), _mm(4096, 1, 4096, 2), _mm(1, 4096, 4096, 2),
    _mm(4096, 4096, 1, 2), _mm(1024, 1024, 1024, 4), _mm(8, 4096, 4096, 2), *_ridge_cases()])


def _intensity_ref(m: int, n: int, k: int, bytes_per_element: int) -> float:
    return lib.arithmetic_intensity(m, n, k, bytes_per_element)


def _elements(m: int, n: int, k: int) -> int:
    return m * k + k * n + m * n


_INTENSITY_MISTAKES = (
    (lambda m, n, k, bytes_per_element: 2 * m * n * k // (_elements(m, n, k) * bytes_per_element),
     "use true division /, not //: the intensity is a real number, // truncates it (to 0 below 1 FLOP/byte)"),
    (lambda m, n, k, bytes_per_element: 2 * m * n * k / ((m * k + k * n) * bytes_per_element),
     "the output C[m, n] is written too: add its m*n elements to the bytes moved"),
    (lambda m, n, k, bytes_per_element: 2 * m * n * k / (_elements(m, n, k) * 4),
     "you counted 4 bytes per element (fp32) whatever the dtype: use the bytes_per_element argument"),
    (lambda m, n, k, bytes_per_element: m * n * k / (_elements(m, n, k) * bytes_per_element),
     "count 2 FLOPs per term (a multiply and an add): 2*m*n*k"),
    (lambda m, n, k, bytes_per_element: 2 * m * n * k / _elements(m, n, k),
     "you divided by elements, not bytes: multiply the elements moved by bytes_per_element"),
    (lambda m, n, k, bytes_per_element: 2 * m * n * k / ((_elements(m, n, k) + m * n) * bytes_per_element),
     "you counted C twice (read and written): the product only writes C, so count its m*n elements once"),
)


@register("shapes", "intensity", ("arithmetic_intensity",), SHAPES_NB)
def _check_intensity(arithmetic_intensity: Callable) -> str:
    def same(got: Any, want: float, case: Case) -> str | None:
        return _number(got, want, "the intensity")

    def student(m, n, k, bytes_per_element):
        return arithmetic_intensity(m, n, k, bytes_per_element)

    tried = judge(INTENSITY_CASES, student, _intensity_ref, _INTENSITY_MISTAKES, same=same)
    return (f"2mnk FLOPs over (mk + kn + mn) elements read or written, times the bytes per element ({tried} shapes: "
            "each side at 1, 1 to 8 bytes, either side of six GPUs' ridge points)")


# ------------------------------------------------------------------------------------------------ roofline

#: (GPU, precision) pairs whose knees spread from about 10 to over 400 FLOP/B.
_DEVICES = (("H100", "bf16"), ("A100", "bf16"), ("V100", "fp16"), ("L40S", "bf16"), ("H200", "bf16"),
            ("A100", "fp32"), ("H100 PCIe", "tf32"))


def _bound(intensity: float, gpu: str, precision: str, note: str, size: float) -> Case:
    peak, bw = lib.spec_roofline(gpu, precision)
    return Case(f"intensity {intensity:.6g} FLOP/B on the {gpu} in {precision} ({peak / 1e12:g} TFLOP/s, "
                f"{bw / 1e12:g} TB/s{note})", {"intensity": intensity, "peak_flops": peak, "bandwidth": bw}, size=size)


def _fixed_bounds() -> list[Case]:
    out, order = [], 0
    for gpu, precision in _DEVICES:
        peak, bw = lib.spec_roofline(gpu, precision)
        knee = peak / bw
        for factor, note in ((1.0, ""), (0.5, ", half the knee"), (2.0, ", twice the knee"), (1 - 1e-4, ", just below the knee"),
                             (1 + 1e-4, ", just above the knee"), (1.0, ", the knee itself")):
            value = 1.0 if note == "" else knee * factor
            out.append(_bound(value, gpu, precision, note, order))
            order += 1
    for gpu, precision in _DEVICES[:2]:  # a kernel that moves bytes and computes nothing, tried last
        out.append(_bound(0.0, gpu, precision, ", no arithmetic", 10 ** 9))
    out.append(Case("intensity 10 FLOP/B, a peak of 3 x 10^14 FLOP/s and 2 x 10^12 B/s given as ints",
                    {"intensity": 10, "peak_flops": 3 * 10 ** 14, "bandwidth": 2 * 10 ** 12}, size=order))
    return out


def _draw_bound(rng: random.Random) -> Case:
    gpu, precision = rng.choice(_DEVICES)
    return _bound(10 ** rng.uniform(-1, 4), gpu, precision, "", 1000 + rng.random())


ROOFLINE_CASES = seeded(_draw_bound, 24, seed=2, fixed=_fixed_bounds())


def _roofline_ref(intensity: float, peak_flops: float, bandwidth: float) -> float:
    return lib.attainable(float(intensity), peak_flops, bandwidth)


_H100 = lib.spec_roofline("H100", "bf16")
_ROOFLINE_MISTAKES = (
    (lambda intensity, peak_flops, bandwidth: min(peak_flops, intensity * bandwidth) / 1e12,
     "return FLOP/s, not TFLOP/s"),
    (lambda intensity, peak_flops, bandwidth: min(_H100[0], intensity * bandwidth),
     "the bound used the H100's peak, not the peak_flops argument"),
    (lambda intensity, peak_flops, bandwidth: min(peak_flops, intensity * _H100[1]),
     "the bound used the H100's bandwidth, not the bandwidth argument"),
    (lambda intensity, peak_flops, bandwidth: min(_H100[0], intensity * _H100[1]),
     "the bound used the H100's figures, not the peak_flops and bandwidth arguments"),
    (lambda intensity, peak_flops, bandwidth: intensity * bandwidth,
     "above the knee the compute peak caps the bound: the lower of the two roofs, min(peak, intensity x bandwidth)"),
    (lambda intensity, peak_flops, bandwidth: float(peak_flops),
     "below the knee memory limits the kernel: the lower of the two roofs, min(peak, intensity x bandwidth)"),
    (lambda intensity, peak_flops, bandwidth: max(peak_flops, intensity * bandwidth),
     "that is the higher of the two roofs: the bound is the lower one, min(peak, intensity x bandwidth)"),
)


@register("shapes", "roofline", ("roofline_bound",), SHAPES_NB)
def _check_roofline(roofline_bound: Callable) -> str:
    def same(got: Any, want: float, case: Case) -> str | None:
        problem = _number(got, want, "the bound")
        if problem and "number" not in problem:  # state which roof the expected value is on: a fact of the case
            kw = case.kwargs
            roof = "the memory roof, intensity x bandwidth" if want < kw["peak_flops"] else "the compute roof, the peak"
            problem += f" FLOP/s ({roof})"
        return problem

    def student(intensity, peak_flops, bandwidth):
        return roofline_bound(intensity, peak_flops, bandwidth)

    tried = judge(ROOFLINE_CASES, student, _roofline_ref, _ROOFLINE_MISTAKES, same=same)
    return (f"attainable FLOP/s = min(peak, intensity x bandwidth) on {tried} cases: seven GPUs and precisions, at, "
            "just below and just above each knee")


# ------------------------------------------------------------------------------------------------ padding

_MULTIPLES = (1, 2, 3, 4, 7, 8, 12, 16, 64, 100, 128)


def _pad(n: int, k: int) -> Case:
    return Case(f"n={n}, k={k}", {"n": n, "k": k}, size=math.log10(n) + k / 1000)


def _draw_pad(rng: random.Random) -> Case:
    k = rng.choice(_MULTIPLES)
    q = rng.randint(1, 2000)
    return _pad(max(1, q * k + rng.choice((-1, 0, 1, rng.randint(1, k)))), k)


PADDING_CASES = seeded(_draw_pad, 30, seed=3, fixed=[
    _pad(1, 1), _pad(1, 8), _pad(7, 1), _pad(3, 4), _pad(5, 3), _pad(6, 3), _pad(7, 3), _pad(64, 64), _pad(65, 64),
    _pad(37, 12), _pad(13, 12), _pad(24, 12), _pad(25, 12), _pad(1000, 8), _pad(1001, 8), _pad(50257, 64),
    _pad(99, 100), _pad(10 ** 17 + 1, 8)])


def _padding_same(got: Any, want: int, case: Case) -> str | None:
    n, k = case.kwargs["n"], case.kwargs["k"]
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        return f"the padded size is {got!r} ({type(got).__name__}), expected the int {want}"
    got = int(got)
    if got == want:
        return None
    if got == -(-n // k) and got != want:
        return (f"the padded size is {got}, expected {want}: {got} is the number of blocks of {k}; the padded size "
                "is that many blocks of k elements")
    if got < n:
        return f"the padded size is {got}, smaller than n = {n}: round up to {want}, never down"
    if got % k:
        return f"the padded size is {got}, expected {want}: {got} is not a multiple of {k}"
    stays = " (a size that is already a multiple stays as it is)" if n % k == 0 else ""
    return f"the padded size is {got}, a multiple of {k} but not the smallest that is >= {n}: expected {want}{stays}"


@register("shapes", "padding", ("pad_to_multiple",), SHAPES_NB)
def _check_padding(pad_to_multiple: Callable) -> str:
    tried = judge(PADDING_CASES, lambda n, k: pad_to_multiple(n, k), lib.pad_to_multiple, same=_padding_same)
    return (f"the smallest multiple of k that is >= n, as an int ({tried} cases on every side of a multiple, k not a "
            "power of two, k = 1, n < k)")
