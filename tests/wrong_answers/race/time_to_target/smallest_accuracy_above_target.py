"""Family: inputs that never reach the mistake (a curve that only rises). Finds the smallest accuracy at or above
the target and returns its time: on a curve that goes above and back down (still above), that is a later
evaluation than the first to reach the target."""
EXPECT = "FIRST"


def time_to_target(times, accuracies, target):
    above = [a for a in accuracies if a >= target]
    if not above:
        return None
    return times[accuracies.index(min(above))]
