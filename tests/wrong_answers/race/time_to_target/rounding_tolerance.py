"""Family: part of the result right. Counts an accuracy within a thousandth of the target as reached ("rounding"):
an evaluation that missed the target by 0.0005 is taken as reaching it."""
EXPECT = "expected None"


def time_to_target(times, accuracies, target):
    for t, acc in zip(times, accuracies):
        if acc >= target - 1e-3:
            return t
    return None
