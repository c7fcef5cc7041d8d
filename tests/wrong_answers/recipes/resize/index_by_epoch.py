"""Reads the schedule by position (schedule[epoch]), as if there were one pair per epoch."""
EXPECT = "start <= epoch"


def resolution_at(schedule, epoch):
    return schedule[min(epoch, len(schedule) - 1)][1]
