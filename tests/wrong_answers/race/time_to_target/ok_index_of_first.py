"""Correct: the index of the first accuracy at or above the target, then its time."""


def time_to_target(times, accuracies, target):
    hits = [i for i, acc in enumerate(accuracies) if acc >= target]
    return times[hits[0]] if hits else None
