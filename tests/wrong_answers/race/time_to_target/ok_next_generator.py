"""Correct: the first matching time through next() with a default."""


def time_to_target(times, accuracies, target):
    return next((t for t, acc in zip(times, accuracies) if acc >= target), None)
