"""Family: inputs that never reach the mistake (a schedule whose sizes only change every few epochs hides it).
Counts epochs from 1: every change of size comes one epoch early."""
EXPECT = "epochs count from 0"


def resolution_at(schedule, epoch):
    size = schedule[0][1]
    for start, side in schedule:
        if start <= epoch + 1:
            size = side
    return size
