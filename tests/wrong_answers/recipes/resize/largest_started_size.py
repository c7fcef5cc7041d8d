"""The largest size among the started pairs: right while sizes only grow, wrong once a schedule goes down."""
EXPECT = ["largest size", "LAST started pair"]


def resolution_at(schedule, epoch):
    return max(size for start, size in schedule if start <= epoch)
