"""Correct: among the pairs that have started, the one with the latest start (the schedule need not be walked)."""


def resolution_at(schedule, epoch):
    start, size = max((pair for pair in schedule if pair[0] <= epoch), key=lambda pair: pair[0])
    return size
