"""Correct: the started pairs in a list, the last one's size."""


def resolution_at(schedule, epoch):
    started = [size for start, size in schedule if start <= epoch]
    return started[-1]
