"""Family: inputs that never reach the mistake (a curve that only rises). Keeps the time of the last evaluation at
or above the target: on a curve that dips and comes back, that is not when the target was first reached."""
EXPECT = "FIRST"


def time_to_target(times, accuracies, target):
    found = None
    for t, acc in zip(times, accuracies):
        if acc >= target:
            found = t
    return found
