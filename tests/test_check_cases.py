"""dlo.course.checks.cases: seeded cases in a fixed order, values and gradients compared, one line per failure."""
import random

import pytest
import torch

from dlo.course.checks.cases import Case, compare, expect_same, first_failure, seeded, tolerance
from dlo.course.checks.framework import CheckFailed


def _draw(rng: random.Random) -> Case:
    n, d = rng.randint(1, 6), rng.randint(2, 5)
    dtype = rng.choice([torch.float32, torch.float64, torch.bfloat16])
    g = torch.Generator().manual_seed(rng.randint(0, 10 ** 6))
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    return Case(f"{dtype}, {n}x{d}", {"x": x}, size=n * d)


CASES = seeded(_draw, 12, seed=3, fixed=[Case("one row of one", {"x": torch.ones(1, 1)}, size=1)])


def reference(x):
    return torch.softmax(x, -1)


def ok_written_out(x):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def normaliser_without_grad(x):
    e = torch.exp(x)
    with torch.no_grad():
        s = e.sum(-1, keepdim=True)
    return e / s


def over_the_wrong_axis(x):
    return torch.softmax(x, 0)


def test_cases_are_the_same_every_time_and_smallest_first():
    again = seeded(_draw, 12, seed=3, fixed=[Case("one row of one", {"x": torch.ones(1, 1)}, size=1)])
    assert [c.label for c in CASES] == [c.label for c in again]
    assert all(torch.equal(a.kwargs["x"], b.kwargs["x"]) for a, b in zip(CASES, again))
    assert [c.size for c in CASES] == sorted(c.size for c in CASES)
    assert CASES[0].label == "one row of one"  # a fixed case goes first among equal sizes


def test_a_correct_alternative_passes_values_and_gradients():
    assert expect_same(CASES, ok_written_out, reference, grads=True) == len(CASES)


def test_a_normaliser_without_gradient_fails_on_the_gradient_only():
    assert first_failure(CASES, normaliser_without_grad, reference) is None  # values alone cannot see it
    case, problem = first_failure(CASES, normaliser_without_grad, reference, grads=True)
    assert problem.startswith("the gradient of x differs by"), problem
    assert case is CASES[0]  # even one element: the true gradient is 0, the detached one is not


def test_the_smallest_failing_case_is_named():
    case, problem = first_failure(CASES, over_the_wrong_axis, reference)
    assert case is next(c for c in CASES if c.kwargs["x"].shape[1] > 1)  # one column: both axes give 1
    with pytest.raises(CheckFailed, match=rf"^with {case.label}: the result differs by"):
        expect_same(CASES, over_the_wrong_axis, reference)


def test_an_exception_names_the_case_and_the_stub_goes_through():
    def raises(x):
        raise IndexError("dimension out of range")

    def stub(x):
        raise NotImplementedError("write it")

    with pytest.raises(CheckFailed, match="with one row of one: it raised IndexError: dimension out of range"):
        expect_same(CASES, raises, reference)
    with pytest.raises(NotImplementedError):
        expect_same(CASES, stub, reference)


def test_compare_names_shape_dtype_and_position():
    want = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert compare(want.clone(), want, "out") is None
    assert compare(want.t().contiguous(), want, "out") == "out differs by 1 at [0, 1] (got 3, expected 2)"
    assert compare(want[0], want, "out") == "out has shape (2,), expected (2, 2)"
    assert compare(want.double(), want, "out") == "out is torch.float64, expected torch.float32"
    assert compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]), "out").startswith("out is nan at [1]")
    assert compare((1, [2.0, 3.0]), (1, [2.0, 3.5]), "r") == "r[1][1] is 3, expected 3.5"
    assert compare({"a": 1}, {"b": 1}, "r") == "r has keys ['a'], expected ['b']"
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]), "idx") == "idx differs at [1] (got 2, expected 3)"


def test_of_largest_allows_a_fraction_of_the_largest_value_everywhere():
    """Weights after a step: each element may move by ``of_largest`` times the largest magnitude, so a tiny weight
    with a large relative error passes, a difference above that fraction does not, and a NaN never does."""
    want = {"w": torch.tensor([100.0, 1e-3, -2.0], dtype=torch.float64)}
    near = {"w": want["w"] + torch.tensor([0.0, 5e-3, 0.0], dtype=torch.float64)}  # 500 % of 1e-3, 5e-5 of 100
    assert compare(near, want, "state", of_largest=1e-4) is None
    assert compare(near, want, "state") is not None  # element-wise, the small weight is far off
    far = {"w": want["w"] + torch.tensor([0.0, 0.0, 0.02], dtype=torch.float64)}  # 2e-4 of the largest
    assert compare(far, want, "state", of_largest=1e-4) == "state['w'] differs by 0.02 at [2] (got -1.98, expected -2)"
    nan = {"w": torch.tensor([100.0, float("nan"), -2.0], dtype=torch.float64)}
    assert "expected 0.001" in compare(nan, want, "state", of_largest=1e-4)
    assert compare({"w": want["w"].float()}, want, "state", of_largest=1.0) == \
        "state['w'] is torch.float32, expected torch.float64"


def test_tolerance_follows_the_dtype():
    x = torch.tensor([1.0])
    assert compare(x + 0.01, x, "v", dtype=torch.bfloat16) is None  # within bfloat16's rounding
    assert compare(x + 0.01, x, "v") is not None  # not within float32's
    assert tolerance(torch.float64) < tolerance(torch.float32) < tolerance(torch.bfloat16)


def test_judge_names_a_mistake_only_when_its_formula_gives_the_answer_on_every_case():
    from dlo.course.checks.cases import judge

    def draw(rng):
        n = rng.randint(1, 50)
        return Case(f"n={n}", {"n": n}, size=n)

    cases = seeded(draw, 8, seed=1)

    def reference(n):
        return n * (n + 1) // 2

    mistakes = [(lambda n: n * n // 2, "n * n / 2: the last term counted once too few")]
    with pytest.raises(CheckFailed, match=r"^with n=\d+: the result is \d+, expected \d+: n \* n / 2"):
        judge(cases, lambda n: n * n // 2, reference, mistakes)
    # wrong in the same places, but not that formula everywhere: the case and the difference only, no guess
    with pytest.raises(CheckFailed) as info:
        judge(cases, lambda n: n * n // 2 if n % 2 else n * n // 2 + 1, reference, mistakes)
    assert "n * n / 2" not in str(info.value) and str(info.value).startswith("with n=")
    assert judge(cases, lambda n: sum(range(n + 1)), reference, mistakes) == len(cases)
