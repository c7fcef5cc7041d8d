"""Correct: an index loop with for/else, the time converted to float."""


def time_to_target(times, accuracies, target):
    for i in range(len(accuracies)):
        if not accuracies[i] < target:
            break
    else:
        return None
    return float(times[i])
